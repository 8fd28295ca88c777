"""A full-attention KV cache layer that grows into spare room instead of being copied whole on
every decoded token.

transformers' DynamicLayer appends a token's keys and values with `torch.cat`, which allocates
and copies the whole cache of that layer each step: per token, O(context) bytes per layer. In a
one-step profile of Qwen2-VL-2B in bf16 at a 512-token context (2-core Sapphire Rapids, shared)
`aten::cat` took 17% of the step (9% on a 2-core EPYC), and the share grows with the context.
GrowingLayer keeps its K/V in buffers with spare room (an eighth more, at least ROOM_MIN tokens)
and hands out views of the filled part: the same values, so every reader (attention, cropping,
the KV store's spill) is unchanged, and a copy happens only when the room runs out.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers.cache_utils import DynamicLayer

ROOM_MIN = 32  # tokens of spare room at least, after a prefill or a regrowth


def _starts(view: torch.Tensor | None, buf: torch.Tensor) -> bool:
    """`view` is the filled opening of `buf` (not replaced since: a crop keeps it so)."""
    return (
        view is not None
        and view.dim() == buf.dim()
        and view.data_ptr() == buf.data_ptr()
        and view.shape[:-2] == buf.shape[:-2]
        and view.stride() == buf.stride()
    )


# numpy over same-width integers on the CPU: torch's copy into a strided slice above its grain
# size (32K elements) goes to its thread pool, which on a busy 2-core machine took 8-21 ms a layer
# for a 305-token restored part of 2 KV heads; numpy copies the same bits in a plain loop
_RAW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def _put(dst: torch.Tensor, src: torch.Tensor) -> None:
    raw = _RAW.get(dst.dtype)
    if raw is not None and src.dtype == dst.dtype and dst.device.type == "cpu" and src.device.type == "cpu":
        np.copyto(dst.detach().view(raw).numpy(), src.detach().view(raw).numpy())
    else:
        dst.copy_(src)


def _buffer(states: torch.Tensor, cap: int) -> torch.Tensor:
    """An empty buffer like `states` with room for `cap` tokens."""
    return states.new_empty(*states.shape[:-2], cap, states.shape[-1])


class GrowingLayer(DynamicLayer):
    """DynamicLayer whose `keys`/`values` are views of buffers with room to grow."""

    # the KV store spills it as a DynamicLayer (engine/kvstore/layout.py): token t's K/V are the same
    plain_full_attention = True
    _room: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, add = self.get_seq_length(), key_states.shape[-2]
        room = self._room
        if (
            room is None
            or not _starts(self.keys, room[0])
            or not _starts(self.values, room[1])
            or n + add > room[0].shape[-2]
        ):
            cap = n + add + max(ROOM_MIN, (n + add) // 8)
            room = (_buffer(key_states, cap), _buffer(value_states, cap))
            if n:
                keys, values = self.keys, self.values
                assert keys is not None and values is not None  # initialized above, and holding n tokens
                _put(room[0][..., :n, :], keys)
                _put(room[1][..., :n, :], values)
            self._room = room
        _put(room[0][..., n : n + add, :], key_states)
        _put(room[1][..., n : n + add, :], value_states)
        self.keys, self.values = room[0][..., : n + add, :], room[1][..., : n + add, :]
        return self.keys, self.values

    def reset(self) -> None:
        self._room = None
        super().reset()

    def held(self) -> tuple[torch.Tensor, ...]:
        """The tensors this layer keeps in memory, spare room included (the memory ledger's count)."""
        if self._room is not None and _starts(self.keys, self._room[0]):
            return self._room
        return tuple(t for t in (self.keys, self.values) if t is not None)


def full_attention(layer) -> bool:
    """A plain full-attention layer (DynamicLayer or this one): not sliding, not quantized."""
    return type(layer) in (DynamicLayer, GrowingLayer) and not getattr(layer, "is_sliding", False)


def with_room(cache):
    """`cache` with its plain DynamicLayers turned into GrowingLayers holding the same tensors (a
    restored cache too: its first update moves them into room, once); others are left alone."""
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer:
            grown = GrowingLayer()
            grown.__dict__.update(layer.__dict__)
            cache.layers[i] = grown
    return cache
