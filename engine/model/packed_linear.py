"""Full-precision linears of the language model with their weights prepacked for oneDNN (CPU).

Why: `F.linear` on a CPU hands a bf16 weight to oneDNN in plain row-major layout, and oneDNN
reorders the whole weight into its blocked layout on every call. For a prompt that cost is
small next to the matrix product; for one decoded token it is most of the work. Measured on a
2-core Sapphire Rapids VM (AVX-512, AVX512_BF16, AMX), one row through Qwen2-VL-2B's 1536->8960
projection with the weight in cache: bf16 F.linear 3.3 GB/s, prepacked 37.5 GB/s; streaming 8
layers' linears from memory (CPU time, the machine shared): 127 -> 61 ms. torch's own compiler
does the same when it freezes a model (`mkldnn._reorder_linear_weight`); here it is done once at
load, no compiler needed. Whether a format runs faster packed is measured per machine
(calibrate.py): on the shared machine the answer for bf16 one-row products changed with the
load on it (streaming, wall time: packed 2x faster; the calibration in CPU time under a load
average of 8: plain faster), so it is never assumed for a measured model.

The packed weight is an opaque oneDNN tensor (no data pointer, no row access), held as a
non-persistent buffer so the memory ledger counts it. A tied output head gets its own packed
copy: the token embedding still needs the plain table to look rows up (Qwen2-VL-2B: +467 MB in
bf16, counted by weights.estimate_bytes).

Exactness: a packed linear is one fixed oneDNN kernel per row count, the same for a prompt chunk
and a decoded token as F.linear's was; its results differ from F.linear's in the last bits for
64+ rows, so KV written with and without packing never mix (weights.WeightPlan.fingerprint_part
names the layout).
"""

from __future__ import annotations

import torch
from torch import nn

LAYOUT = "onednn-packed-v1"  # in the KV store namespace: change it when the arithmetic changes
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def available(dtype: torch.dtype) -> bool:
    """Whether this torch build's oneDNN can pack and run linears in `dtype` on this CPU."""
    if not torch.backends.mkldnn.is_available() or dtype not in DTYPES:
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if dtype == torch.float16:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return True


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """The weight (out, in) reordered once into oneDNN's blocked layout for few-row products
    (the batch-size hint 1: decode is what it must serve at memory speed)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), 1)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T + bias through oneDNN with the weight as pack_weight left it."""
    # oneDNN takes any leading dims; a non-contiguous input would be copied by it anyway
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [None], "")


class PackedLinear(nn.Module):
    """y = x @ weight.T + bias through oneDNN with the prepacked weight."""

    def __init__(self, packed: torch.Tensor, in_features: int, out_features: int, bias: torch.Tensor | None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("packed", packed, persistent=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    packed: torch.Tensor

    @classmethod
    def of(cls, linear: nn.Linear) -> PackedLinear:
        return cls(pack_weight(linear.weight), linear.in_features, linear.out_features, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.packed, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.packed.dtype}, oneDNN-packed"


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, new)


def pack_linears(model: nn.Module, skip: tuple[str, ...]) -> int:
    """Swap every plain nn.Linear outside `skip` (the vision encoder and projector: reloaded from
    the folder by the elastic encoder, and run on many rows only) for a PackedLinear, the output
    head included; the plain weights are let go. Returns how many were packed."""
    outside = tuple(p + "." for p in skip)
    count = 0
    for name, module in list(model.named_modules()):
        if type(module) is nn.Linear and not name.startswith(outside) and module.weight.device.type == "cpu":
            _replace(model, name, PackedLinear.of(module))
            count += 1
    return count
