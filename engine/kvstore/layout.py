"""What a spillable cache looks like, and the one check that refuses everything else: for a
model before its first turn (model_refusal) and for a cache being spilled (inspect_cache).

Only plain full-attention `DynamicLayer`s are spilled: their K/V for token t is a pure function of
tokens <= t, so a prefix of blocks is an exact prefix cache. A sliding-window layer has dropped old
tokens, recurrent/linear-attention state is not per token, quantized layers keep a residual
buffer — spilling those as blocks would restore wrong attention, so they are refused by name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from .errors import UnsupportedCache

DTYPE_CODES = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}
CODE_DTYPES = {v: k for k, v in DTYPE_CODES.items()}
DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
NAME_DTYPES = {v: k for k, v in DTYPE_NAMES.items()}
# Same-width integer views for bit-exact copies: torch's strided bf16 copy_ is ~500x slower on
# CPU than the same bytes copied as int16, and the store never converts values anyway.
RAW_DTYPES = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}

_WHY = {
    "DynamicSlidingWindowLayer": "sliding-window attention keeps only the last window of tokens",
    "StaticSlidingWindowLayer": "sliding-window attention keeps only the last window of tokens",
    "LinearAttentionLayer": "linear-attention/recurrent state is not stored per token",
    "DynamicIndexedLayer": "the layer carries an extra indexer cache the store does not save",
    "QuantoQuantizedLayer": "quantized KV keeps a residual buffer the store does not save",
    "HQQQuantizedLayer": "quantized KV keeps a residual buffer the store does not save",
}


def shape_row(row: Iterable[Any]) -> tuple[int, int, int, int]:
    """One layer's (k_heads, k_dim, v_heads, v_dim) as ints; anything but four values is refused."""
    kh, kd, vh, vd = (int(x) for x in row)
    return kh, kd, vh, vd


@dataclass(frozen=True)
class KVLayout:
    """dtype and per-layer shapes: (k_heads, k_dim, v_heads, v_dim). Payload order per blob:
    for each layer, K as [k_heads, n, k_dim] then V as [v_heads, n, v_dim], C-contiguous."""

    dtype: torch.dtype
    shapes: tuple[tuple[int, int, int, int], ...]

    @property
    def raw_dtype(self) -> torch.dtype:
        return RAW_DTYPES[self.dtype]

    @property
    def n_layers(self) -> int:
        return len(self.shapes)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def token_bytes(self) -> int:
        return self.itemsize * sum(kh * kd + vh * vd for kh, kd, vh, vd in self.shapes)

    def segments(self, n_tokens: int):
        """(layer, kv, heads, dim, payload_offset, nbytes) for each tensor of a blob, in order."""
        off = 0
        for layer, (kh, kd, vh, vd) in enumerate(self.shapes):
            for kv, (h, d) in enumerate(((kh, kd), (vh, vd))):
                nbytes = h * n_tokens * d * self.itemsize
                yield layer, kv, h, d, off, nbytes
                off += nbytes

    def to_json(self) -> dict:
        return {"dtype": DTYPE_NAMES[self.dtype], "shapes": [list(s) for s in self.shapes]}

    @staticmethod
    def from_json(d: dict) -> KVLayout:
        return KVLayout(NAME_DTYPES[d["dtype"]], tuple(shape_row(s) for s in d["shapes"]))


def _full_attention_class():
    from transformers.cache_utils import DynamicLayer  # the one layer type we spill

    return DynamicLayer


def layer_refusal(layer: Any) -> str | None:
    """Why this cache layer cannot be spilled exactly, or None for a plain full-attention layer
    (exact type: subclasses such as sliding-window or quantized are refused, unless the class
    says it is plain full attention, as the engine's growing layer does)."""
    sliding = getattr(layer, "is_sliding", False)
    plain = type(layer) is _full_attention_class() or getattr(type(layer), "plain_full_attention", False)
    if plain and not sliding:
        return None
    why = _WHY.get(type(layer).__name__)
    if why is None and sliding:
        why = _WHY["DynamicSlidingWindowLayer"]
    return why or "only plain full-attention DynamicLayer caches can be spilled exactly"


def model_refusal(config: Any) -> str | None:
    """Why the cache transformers builds for a model with this config cannot be spilled (None when
    it can): decided once at load, so such a model's conversations simply stay in memory."""
    from transformers.cache_utils import DynamicCache

    odd = sorted({type(layer).__name__ for layer in DynamicCache(config=config).layers if layer_refusal(layer)})
    if odd:
        return (
            f"this model's cache has {', '.join(odd)} layers (sliding window or recurrent state); "
            "Parley only spills plain full-attention KV, so its conversations stay in memory"
        )
    return None


def inspect_cache(cache: Any, n_tokens: int) -> tuple[KVLayout, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Check a transformers cache is spillable and return its layout and (K, V) per layer.

    Raises UnsupportedCache naming the first layer layer_refusal refuses.
    """
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise UnsupportedCache(f"{type(cache).__name__} is not a transformers Cache with .layers")
    if not layers:
        raise UnsupportedCache("cache has no layers")
    dtype = None
    shapes = []
    kv = []
    for i, layer in enumerate(layers):
        name = type(layer).__name__
        why = layer_refusal(layer)
        if why:
            raise UnsupportedCache(f"layer {i} is {name}: {why}; not spilled", i, name)
        k, v = layer.keys, layer.values
        if not getattr(layer, "is_initialized", False) or k is None or v is None or k.dim() != 4:
            raise UnsupportedCache(f"layer {i} ({name}) holds no K/V (shared or uninitialized layer)", i, name)
        if k.shape[0] != 1 or v.shape[0] != 1:
            raise UnsupportedCache(f"layer {i}: batch size {k.shape[0]} (only batch 1 is spilled)", i, name)
        if k.shape[2] != v.shape[2]:
            raise UnsupportedCache(f"layer {i}: K has {k.shape[2]} tokens, V has {v.shape[2]}", i, name)
        if k.shape[2] < n_tokens:
            raise ValueError(f"layer {i} holds {k.shape[2]} tokens, fewer than the {n_tokens} token ids given")
        if k.dtype != v.dtype or k.dtype not in DTYPE_CODES:
            raise UnsupportedCache(f"layer {i}: dtype {k.dtype}/{v.dtype} (float32/float16/bfloat16 only)", i, name)
        if dtype is None:
            dtype = k.dtype
        elif k.dtype != dtype:
            raise UnsupportedCache(f"layer {i}: dtype {k.dtype} differs from layer 0 ({dtype})", i, name)
        shapes.append((int(k.shape[1]), int(k.shape[3]), int(v.shape[1]), int(v.shape[3])))
        kv.append((k, v))
    assert dtype is not None  # set by the first layer, and there is one (checked above)
    return KVLayout(dtype, tuple(shapes)), kv


def build_cache(tensors: list[tuple[torch.Tensor, torch.Tensor]]):
    """A DynamicCache of full-attention layers holding exactly these [1, H, n, D] tensors (no copy)."""
    from transformers.cache_utils import DynamicCache

    full = _full_attention_class()
    cache = DynamicCache()
    for k, v in tensors:
        layer = full()
        layer.lazy_initialization(k, v)  # sets device/dtype bookkeeping the way update() would
        layer.keys, layer.values = k, v  # adopt without the torch.cat copy update() would make
        cache.layers.append(layer)
    return cache
