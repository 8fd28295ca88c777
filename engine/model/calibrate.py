"""Measure, on this machine, how fast each weight format's kernels run one layer of a model's
shape, so that `auto` picks by measurement, not by a table of CPUs (speed.py keeps the record).

One layer's linears (q, k, v, o, gate, up, down) are built in each format with random weights
through the very modules the engine runs (nn.Linear, packed_linear.PackedLinear,
int8_layers.Int8Linear) and timed for one row (a decoded token) and for PROMPT rows (a prompt chunk). One row is timed
over enough copies of the layer to fill WORKING_SET bytes, so the weights stream from memory as
a real model's do, not from the CPU's cache. Full-precision formats are timed plain and packed,
int8 with bf16 and with fp32 activations (which a CPU runs well depends on its bf16 units; bf16
ones left untimed where their prompts alone would lose, _cannot_win), and
each of them with its decoded rows through numba's kernels (row_kernels.py) where numba runs
here; int4 only runs on those. The fastest of each format is kept, and the record says which
(FormatSpeed.packed, .decode_dtype, .rows). A few seconds in all,
once per machine and shape.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..device.heap_trim import return_freed_heap
from . import packed_linear, row_kernels, speed
from .int8_layers import Int8Linear
from .speed import FormatSpeed, LayerShape

log = logging.getLogger(__name__)

WORKING_SET = 1 << 30  # bytes of weights one-row timing cycles through (past any CPU cache)
PROMPT = 256  # rows of the prompt-chunk timing
# passes timed, the best kept: a one-row pass streams WORKING_SET (about 0.1 s), a prompt pass
# computes one layer for PROMPT rows (about a second in fp32 at Qwen2-VL-2B's widths on 2 cores)
DECODE_REPEATS, PROMPT_REPEATS = 3, 2
# Smaller language models are not measured (`auto` keeps full precision first, fp32 on a CPU):
# their turns take milliseconds in any format, and at such widths a timing measures call
# overhead, not the kernels. SmolVLM-256M's language model (135M) is measured.
MIN_PARAMS = speed.MEASURED_FROM_PARAMS
DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def _float_layer(weights: list[torch.Tensor], dtype: torch.dtype, packed: bool):
    """A maker of copies of one layer in `dtype`, plain or packed as the engine packs it."""
    cast = [w.to(dtype) for w in weights]

    def make() -> list[nn.Module]:
        out: list[nn.Module] = []
        for w in cast:
            lin = nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=dtype, device="meta")
            lin.weight = nn.Parameter(w.clone(), requires_grad=False)
            out.append(packed_linear.PackedLinear.of(lin) if packed else lin)
        return out

    return make


def _int8_layer(weights: list[torch.Tensor], dtype: torch.dtype, decode_dtype: torch.dtype | None = None):
    """A maker of copies of one layer in int8 (per-row scales) computing in `dtype`, its decoded
    rows in `decode_dtype` where given."""
    rows = []
    for w in weights:
        scale = w.abs().amax(1).clamp(min=1e-8) / 127
        rows.append(((w / scale[:, None]).round().clamp(-127, 127).to(torch.int8), scale.to(dtype)))
    frozen = lambda t: nn.Parameter(t.clone(), requires_grad=False)  # noqa: E731

    def make() -> list[nn.Module]:
        return [
            Int8Linear(frozen(q), frozen(scale), None, None if decode_dtype is None else frozen(scale.to(decode_dtype)))
            for q, scale in rows
        ]

    return make


def _row_layer(weights: list[torch.Tensor], dtype: torch.dtype, kernels=None):
    """A maker of copies of one layer in `dtype` whose decoded rows go through numba's kernels."""
    cast = [w.to(dtype) for w in weights]

    def make() -> list[nn.Module]:
        return [row_kernels.RowLinear(nn.Parameter(w.clone(), requires_grad=False), None, kernels) for w in cast]

    return make


def _int8_row_layer(weights: list[torch.Tensor], dtype: torch.dtype, kernels=None):
    """int8 (per-row scales) computing in `dtype`, its decoded rows through numba's kernel."""
    make8 = _int8_layer(weights, dtype)

    def make() -> list[nn.Module]:
        return [Int8Linear(m.weight, m.scale, None, None, kernels) for m in make8()]

    return make


def _int4_layer(weights: list[torch.Tensor], dtype: torch.dtype, kernels=None):
    """int4 (Q4_0 blocks) in a model computing in `dtype`."""
    quantized = [row_kernels.Int4Weights.of(w) for w in weights]

    def make() -> list[nn.Module]:
        return [
            row_kernels.Int4Linear(
                row_kernels.Int4Weights(q.nibbles.clone(), q.scales.clone(), q.in_features, q.out_features),
                None,
                kernels,
            )
            for q in quantized
        ]

    return make


def _layer_bytes(layer: list[nn.Module]) -> int:
    total = 0
    for m in layer:
        for t in [*m.parameters(), *m.buffers()]:
            total += t.numel() * t.element_size()
    return total


def _seconds(calls, repeats: int) -> float:
    """Wall seconds of a pass of all `calls`: the best of `repeats`, so a burst of other work on
    a shared machine is left out. Not CPU time: shared out over torch's threads it took a kernel
    that runs on one thread for twice as fast as it is (MKL's fp32 one-row product: on a 2-core
    AMD EPYC with AVX2 it ran on one core at 10 GB/s, oneDNN's packed one on both at 14.5 GB/s,
    and `auto` picked the plain one)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for c in calls:
            c()
        best = min(best, time.perf_counter() - t0)
    return best


@torch.inference_mode()
def _time_format(make, weights: list[torch.Tensor], dtype: torch.dtype, shape: LayerShape) -> tuple[float, float]:
    """(seconds of one layer for one row, for PROMPT rows)."""
    make = make(weights, dtype)
    first = make()
    # as many copies as the model has layers, up to WORKING_SET: a small model's weights stay
    # in the CPU's cache as the real one's would, a large one's stream from memory
    n = min(shape.layers, max(1, WORKING_SET // max(1, _layer_bytes(first))))
    copies = [first] + [make() for _ in range(n - 1)]
    one = [torch.randn(1, w.shape[1], dtype=dtype) for w in weights]
    many = [torch.randn(PROMPT, w.shape[1], dtype=dtype) for w in weights]
    decode_calls = [functools.partial(m, x) for layer in copies for m, x in zip(layer, one, strict=True)]
    prompt_calls = [functools.partial(m, x) for m, x in zip(first, many, strict=True)]
    for c in prompt_calls + decode_calls[: len(weights)]:  # first calls set kernels up
        c()
    decode = _seconds(decode_calls, DECODE_REPEATS) / len(copies)
    prompt = _seconds(prompt_calls, PROMPT_REPEATS)
    return decode, prompt


# what `auto` chooses among (fp32, bf16) and what a quantized format computes in (int8's dtype);
# fp16 is left out: never auto's choice on a CPU, and each format costs seconds at load
FORMATS = ("fp32", "bf16", "int8", "int4")


def measure(shape: LayerShape, formats: tuple[str, ...] = FORMATS, kernels=None) -> list[FormatSpeed]:
    """Each format's expected whole-model tokens/s at `shape`, on this CPU. `kernels`: numba's
    compiled one-row kernels (row_kernels.load), timed beside torch's where given; int4 only
    runs on them."""
    torch.manual_seed(0)
    weights = [torch.randn(o, i) * 0.02 for o, i in shape.linears]
    # the output head: read whole for every token, like one more layer's worth of its size
    head_layers = shape.vocab * shape.hidden / shape.layer_params
    # (format, compute dtype, packed, maker, dtype of int8's decoded rows where not the compute dtype, rows)
    runs: list[tuple[str, torch.dtype, bool, Callable[..., Any], torch.dtype | None, bool]] = []
    rows: Callable[..., Any] = functools.partial(_row_layer, kernels=kernels)
    for fmt in formats:
        if fmt in ("fp32", "bf16", "fp16"):
            dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[fmt]
            runs.append((fmt, dtype, False, functools.partial(_float_layer, packed=False), None, False))
            if packed_linear.available(dtype):
                runs.append((fmt, dtype, True, functools.partial(_float_layer, packed=True), None, False))
            if kernels is not None:
                runs.append((fmt, dtype, False, rows, None, True))
        elif fmt == "int8":  # fp32 first: its turn time is what _cannot_win weighs bf16's against
            runs += [
                ("int8", torch.float32, False, _int8_layer, None, False),
                # fp32 prompts and bf16 decoded rows: both fast on a CPU without bf16 units
                ("int8", torch.float32, False, _int8_layer, torch.bfloat16, False),
            ]
            make8: Callable[..., Any] = functools.partial(_int8_row_layer, kernels=kernels)
            if kernels is not None:
                runs.append(("int8", torch.float32, False, make8, None, True))
            runs.append(("int8", torch.bfloat16, False, _int8_layer, None, False))
            if kernels is not None:
                runs.append(("int8", torch.bfloat16, False, make8, None, True))
        elif fmt == "int4" and kernels is not None:
            make4: Callable[..., Any] = functools.partial(_int4_layer, kernels=kernels)
            runs += [
                ("int4", torch.float32, False, make4, None, True),
                ("int4", torch.bfloat16, False, make4, None, True),
            ]
    candidates: list[FormatSpeed] = []
    for fmt, dtype, packed, make, decode_dtype, by_rows in runs:
        why = _cannot_win(fmt, DTYPE_NAMES[dtype], candidates)
        if why:
            log.info("calibration %s (%s) not timed: %s", fmt, DTYPE_NAMES[dtype], why)
            continue
        t0 = time.perf_counter()
        try:
            rows = make if decode_dtype is None else functools.partial(make, decode_dtype=decode_dtype)
            one, prompt = _time_format(rows, weights, dtype, shape)
        except RuntimeError as exc:  # a dtype this CPU's kernels refuse: not a candidate here
            log.info("calibration: %s with %s activations failed: %s", fmt, dtype, exc)
            continue
        s = FormatSpeed(
            fmt,
            DTYPE_NAMES[dtype],
            decode_tok_s=1 / (one * (shape.layers + head_layers)),
            prefill_tok_s=PROMPT / (prompt * shape.layers),
            packed=packed,
            decode_dtype=DTYPE_NAMES[decode_dtype] if decode_dtype is not None else "",
            rows=by_rows,
        )
        log.info(
            "calibration %s (%s%s): decode %.1f tok/s, prefill %.0f tok/s (%.1f s)",
            fmt,
            s.dtype,
            (", packed" if packed else "")
            + (f", decoded rows in {s.decode_dtype}" if s.decode_dtype else "")
            + (", decoded rows by numba" if by_rows else ""),
            s.decode_tok_s,
            s.prefill_tok_s,
            time.perf_counter() - t0,
        )
        candidates.append(s)
    return _fastest(candidates)


# How much faster than the full-precision model in the same dtype a quantized format's prompt
# chunks are taken to be at most. Measured: int8 and int4 computing in bf16 prefilled at 0.89-0.96
# of the bf16 model on a 2-core AMD EPYC without bf16 units (AVX2 only, Zen 3 class); the bound
# leaves half again as much.
PREFILL_BOUND = 1.5


def _cannot_win(fmt: str, dtype: str, candidates: list[FormatSpeed]) -> str:
    """Why a quantized format's candidate computing in `dtype` need not be timed, '' when it must:
    even prefilling at PREFILL_BOUND times the full-precision model in that dtype and decoding in
    no time at all, its turn would take longer than the format's fastest candidate timed so far.
    Why: on a CPU without bf16 units a bf16 prompt pass takes 4-5 s of the calibration each (three
    of them for int8 and int4: 14 of 30 s on that EPYC, at every first launch) and never wins."""
    if fmt not in ("int8", "int4"):
        return ""
    # through torch's kernels, as the quantized formats' prompts in that dtype are (RowLinear's may
    # compute a bf16 model's prompts in fp32: row_kernels.half_prompt_path)
    dense = [
        c.prefill_tok_s for c in candidates if c.dtype == dtype and c.format in ("fp32", "bf16", "fp16") and not c.rows
    ]
    rivals = [c for c in candidates if c.format == fmt]
    if not dense or not rivals:
        return ""
    best = min(rivals, key=lambda c: c.turn_s())
    floor = speed.TURN_PROMPT / (PREFILL_BOUND * max(dense))
    if floor <= best.turn_s():
        return ""
    return (
        f"its prompts alone would take {floor:.2f} s of a turn (the {dtype} model prefilled "
        f"{max(dense):.0f} tok/s), {fmt} in {best.dtype} took {best.turn_s():.2f} s in all"
    )


# Within this fraction of each other's turn time, a quantized format's candidates count as a tie.
TIE = 0.1


def _fastest(candidates: list[FormatSpeed]) -> list[FormatSpeed]:
    """The fastest candidate of each format by turn time, except that among a quantized format's
    near ties (TIE) the one computing in the dtype whose full-precision model prefilled faster
    wins. Why: with its decoded rows through numba an int8 model decodes through the same kernel
    in either dtype and prefills through the same int8 GEMM, so its candidates differ by noise,
    while the rest of the model (attention, norms, activations: not timed here) runs in that
    dtype. On a 2-core AMD EPYC (Zen 4, AVX512-BF16) noise picked fp32 (decode 12.0 against 11.0
    tok/s), and the int8 model at Qwen2-VL-2B's shape prefilled 59-63 tok/s in fp32 against
    196-213 in bf16."""
    best: dict[str, FormatSpeed] = {}
    for s in candidates:
        if s.format not in best or s.turn_s() < best[s.format].turn_s():
            best[s.format] = s
    dense = [s for s in candidates if s.format in ("fp32", "bf16")]
    if not dense:
        return list(best.values())
    prefill_dtype = max(dense, key=lambda s: s.prefill_tok_s).dtype
    for fmt, s in best.items():
        if fmt in ("int8", "int4") and s.dtype != prefill_dtype:
            ties = [c for c in candidates if c.format == fmt and c.dtype == prefill_dtype]
            near = [c for c in ties if c.turn_s() <= (1 + TIE) * s.turn_s()]
            if near:
                best[fmt] = min(near, key=lambda c: c.turn_s())
    return list(best.values())


def speeds_for(config: dict, data_dir) -> dict[str, FormatSpeed]:
    """This machine's speeds at the model's shape: from the record in `data_dir`, else measured
    now (seconds, once) and recorded. {} when the config does not spell out its sizes or the
    model is below MIN_PARAMS."""
    shape = LayerShape.of_config(config)
    if shape is None or shape.params < MIN_PARAMS:
        return {}
    known = speed.read(data_dir, shape)
    if known:
        if any(s.rows for s in known.values()):
            row_kernels.load(data_dir)  # read from numba's cache (compiled on the first launch)
        return known
    kernels = row_kernels.load(data_dir)  # compiled (or read from its cache) here, timed in the log
    t0 = time.perf_counter()
    measured = measure(shape, kernels=kernels)
    return_freed_heap()  # up to WORKING_SET of layer copies, gone before the model's weights load
    log.info("measured the weight formats' speed at %s in %.1f s", shape.key, time.perf_counter() - t0)
    try:
        speed.write(data_dir, shape, measured)
    except OSError as exc:  # a full or read-only data folder: measured again next load
        log.warning("speed record not written: %s", exc)
    return {s.format: s for s in measured}
