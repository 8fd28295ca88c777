"""Linears of one layer that read the same input (attention's q, k and v; the MLP's gate and up)
compute a decoded row's products in one kernel call over their weights stacked.

Each numba kernel call costs torch and Python work around it (the row converted, the output
made, numba's dispatch, the threads woken): q, k and v at Qwen2-VL-2B's shape took 136 µs as
three int8 calls and 103 as one (2-core Zen 4, in cache). A decoded token made 197 kernel calls
in that model's 28 layers and head, 113 stacked; a step of a 512-token int8 conversation took
51.7 ms against 55.3 (interleaved runs, the same tokens).

The stack is one tensor; the members' weights become row slices of it (views, no second copy),
so their prompt chunks run as before. Each output row of a kernel depends only on that weight
row and the input (numba_rows: a row's sum never depends on which rows come with it), so a
member's columns of the stacked output are the very values it computes alone.

The first member computes the whole stack and keeps it, with the input it was given; the others
take their columns when called with that same tensor, unchanged (its identity and version).
A layer that gives them anything else (another tensor, another order) turns its group off for
good, and each member computes alone again. Model-owner thread only, like the model itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from . import row_kernels
from .int8_layers import Int8Linear
from .row_kernels import Int4Linear, Int4Weights, RowLinear, kernel, kernel_weight, rows_input

SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))

Member = Int8Linear | RowLinear | Int4Linear


def _held(m: Member) -> torch.Tensor:
    """The tensor holding a member's weight rows (an int4 layer's nibbles)."""
    held = m.nibbles if isinstance(m, Int4Linear) else m.weight
    assert isinstance(held, torch.Tensor)
    return held


class SharedInput:
    """One kernel call over the stacked rows of `members` (Int8Linear with numba rows, RowLinear,
    or Int4Linear stored row by row), and the last input's products until each member has taken
    its columns. `run(x, out)` is that call, on rows of input rounded to `dtype` and handed over in
    `takes` (row_kernels.rows_input), into fp32 products."""

    def __init__(
        self,
        members: Sequence[Member],
        dtype: torch.dtype,
        run: Callable[[np.ndarray, np.ndarray], None],
        takes: torch.dtype = torch.float32,
    ):
        self.members = list(members)
        self._index = {id(m): i for i, m in enumerate(members)}
        self._ends = [0]  # member i's columns (and rows of the stack): ends[i]:ends[i + 1]
        for m in members:
            self._ends.append(self._ends[-1] + m.out_features)
        self._dtype = dtype  # the input is rounded to it first, as each member alone does
        self._takes = takes
        self._run = run
        self._pointers: list[int] | None = None  # where the members' rows were at the first call
        self.on = True
        self._x: torch.Tensor | None = None  # the input the kept products are of, held until taken
        self._version = -1
        self._left: set[int] = set()
        self._outs: list[torch.Tensor] = []

    def rows(self, member: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
        """`member`'s products (fp32, rows x its outputs) of the decoded rows `x`, or None: the
        member computes them alone."""
        if not self.on:
            return None
        i = self._index[id(member)]
        if self._x is x and _version(x) == self._version and i in self._left:
            self._left.discard(i)
            out = self._outs[i]
            if not self._left:
                self._x, self._outs = None, []
            return out
        pointers = [_held(m).data_ptr() for m in self.members]
        if self._pointers is None:
            self._pointers = pointers
        if i != 0 or pointers != self._pointers:
            self.on = False  # another input, another order, or weights moved since: alone from now on
            self._x, self._outs = None, []
            return None
        flat = rows_input(x.detach().reshape(-1, x.shape[-1]).to(self._dtype), self._takes)
        products = np.empty((len(flat), self._ends[-1]), np.float32)
        self._run(flat, products)
        stacked = torch.from_numpy(products)
        self._outs = [stacked[:, a:b].contiguous() for a, b in zip(self._ends, self._ends[1:], strict=False)]
        self._x, self._version, self._left = x, _version(x), set(range(1, len(self.members)))
        return self._outs[0]

    def spans(self) -> list[tuple[int, int]]:
        """Each member's rows of the stack."""
        return list(zip(self._ends, self._ends[1:], strict=False))


def _version(x: torch.Tensor) -> int:
    """x's in-place change count; inference-mode tensors (the engine's turns) keep none, and the
    layer code between siblings' calls changes nothing in place."""
    return -1 if x.is_inference() else x._version


def _int8_group(members: list[Int8Linear]) -> SharedInput:
    with torch.no_grad():
        weight = torch.cat([m.weight.detach() for m in members])
        scale = torch.cat([m.scale32 for m in members if m.scale32 is not None])
    assert members[0].rows is not None  # _groupable checked it
    kernels, w, s = members[0].rows, weight.numpy(), scale.numpy()
    # Int8Linear's rows: the input in its scales' dtype, then fp32
    group = SharedInput(
        members, members[0].scale.dtype, lambda x, out: row_kernels.int8_products(x, w, s, out, kernels)
    )
    for m, (a, b) in zip(members, group.spans(), strict=True):
        m.join(group, weight[a:b], scale[a:b])
    return group


def _full_group(members: list[RowLinear]) -> SharedInput:
    with torch.no_grad():
        weight = torch.cat([m.weight.detach() for m in members])
    found = kernel_weight(weight)
    fn = kernel(members[0].kernels, found.name, weight.numel() * weight.element_size())
    run = lambda x, out: row_kernels._call(fn, x, found.bits, out)  # noqa: E731
    group = SharedInput(members, found.takes, run, found.takes)
    for m, (a, b) in zip(members, group.spans(), strict=True):
        m.join(group, weight[a:b])
    return group


def _int4_group(members: list[Int4Linear]) -> SharedInput:
    """Rows of the integer-dot layout (one output row after another): stacked as they are."""
    with torch.no_grad():
        nibbles = torch.cat([m.nibbles for m in members])
        scales = torch.cat([m.scales for m in members])
    first = members[0]
    stacked = Int4Weights(nibbles, scales, first.in_features, len(nibbles), first.path)
    group = SharedInput(members, torch.float32, lambda x, out: stacked.rows(torch.from_numpy(x), out, first.kernels))
    for m, (a, b) in zip(members, group.spans(), strict=True):
        m.join(group, nibbles[a:b], scales[a:b])
    return group


def _groupable(members: list) -> bool:
    first = members[0]
    if type(first) not in (Int8Linear, RowLinear, Int4Linear) or any(type(m) is not type(first) for m in members):
        return False
    if any(m.shared_input is not None for m in members):
        return False  # grouped already
    if any(
        m.in_features != first.in_features
        or _held(m).dtype != _held(first).dtype
        or _held(m).device.type != "cpu"
        or _held(m).is_mkldnn
        or not _held(m).is_contiguous()
        for m in members
    ):
        return False
    if type(first) is Int4Linear:  # the generic layout keeps rows side by side: not stacked
        return first.path != "generic" and all(m.path == first.path for m in members)
    return type(first) is RowLinear or (first.rows is not None and all(m.scale32 is not None for m in members))


_BUILDS: dict[type, Callable[[list], SharedInput]] = {
    Int8Linear: _int8_group,
    RowLinear: _full_group,
    Int4Linear: _int4_group,
}


def share_inputs(model: nn.Module, skip: tuple[str, ...]) -> int:
    """Group the siblings (SIBLINGS) of every layer outside `skip` whose decoded rows run through
    numba's kernels (Int8Linear with rows, RowLinear, Int4Linear). Returns how many groups."""
    outside = tuple(p + "." for p in skip)
    count = 0
    for name, module in model.named_modules():
        if name.startswith(outside):
            continue
        for names in SIBLINGS:
            found = [getattr(module, n, None) for n in names]
            if any(m is None for m in found) or not _groupable(found):
                continue  # not this layer's shape, or not served by numba's rows
            members: list = found
            _BUILDS[type(members[0])](members)
            count += 1
    return count
