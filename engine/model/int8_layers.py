"""The int8 language model's layers: per-row symmetric int8 weights, quantized by torchao, run
without converting the whole weight back to floating point.

Why Parley's own modules: torchao 0.18 quantizes well (transformers' TorchAoConfig with
Int8WeightOnlyConfig), but its Int8Tensor linear converts the entire int8 weight to the
activation dtype on every call and has no fused CPU kernel, so int8 decoded at a third of
bf16's speed on a 2-core CPU at Qwen2-VL-2B's shape. torch's `_weight_int8pack_mm`
multiplies by int8 weights and per-row scales directly (2-3x faster than a bf16 matmul there:
half the bytes to read). torchao's int8 embedding dequantizes the whole table on every lookup,
so the token embedding (15% of a 2B model) was left in bf16; `Int8Embedding` dequantizes only
the rows it looks up, and a tied output head shares the same int8 table and scales (a row is
one token for both: per-row scales fit both uses).

Prompts are not run through that kernel: it takes rows one after another. A prompt chunk
(PROMPT_ROWS or more) goes through a real int8 GEMM where this CPU computes one exactly and fast
(`int8_gemm_used`: `torch._int_mm`, oneDNN's with VNNI or AMX): each row of activations
is quantized to int8 with its own scale (columns with outlier magnitudes are left out of that and
multiplied in floating point, as LLM.int8() does, so one large channel does not coarsen a row),
and the int32 products are scaled by the row's and the weight row's scales. On a 2-core Zen 4
(AVX512-VNNI, no AMX), 512 rows through 1536->8960 and 8960->1536, CPU time: 1.5-1.6x the
prepacked bf16 GEMM, where the dequantized GEMM below ran at 0.91-0.93x (converting the weight
and oneDNN reordering it on every call). Elsewhere the int8 values are turned into the compute
dtype a slice at a time and multiplied by the dense GEMM: where `_int_mm` is wrong (oneDNN held to
AVX2 on that Zen 4 saturated 16-bit pair sums, wrong by thousands) and where it is slow (on a
2-core AMD EPYC with AVX2 and no VNNI it was exact but ran 0.7 GOP/s, the fp32 GEMM 11-18
GFLOP/s: a 512-token int8 prompt at Qwen2-VL-2B's shape took over 15 minutes).

Exactness: each module is a fixed function of its own int8 values, scales and input chunk, as a
full-precision linear is of its weights (the one-row kernel's rows do not depend on each other,
so a decoded token and its draft agree); every fast path (KV reuse, SSD restore) agrees with a
fresh prefill of the same weights as it does for bf16. The KV store namespace names this layout
(weights.WeightPlan.fingerprint_part), so KV written by another int8 layout is never restored.
"""

from __future__ import annotations

import contextlib
import functools
import time
from types import ModuleType
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from .prompt_rows import PROMPT_ROWS

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from .row_kernels import SharedRows

LAYOUT = "int8pack-rows-v4"  # named in the KV store namespace (with the prompt kernel: `layout`)

# Input widths `_weight_int8pack_mm` is trusted with on CPU, by compute dtype. In torch 2.14.1 its
# bf16 kernel returns garbage or crashes the process when the width is not a multiple of 8 (seen
# on an AVX2 CPU), and segfaults at widths that are a multiple of 8 but not of 16 on an AVX-512
# (avx512_bf16) CPU; 64 leaves room for wider vector units. Real models' widths are multiples of
# 64. fp16/fp32 were right at any width on both.
FUSED_WIDTH_MULTIPLE = {torch.bfloat16: 64}


DEQUANTIZED_BYTES = 32 << 20  # weight rows scaled back at a time for a prompt chunk


# A prompt chunk's column is an outlier when its largest magnitude is over OUTLIER times the median
# column's; with more than MAX_OUTLIERS of the columns so, the chunk takes the dequantized GEMM.
OUTLIER = 6.0
MAX_OUTLIERS = 1 / 32


@functools.cache
def int8_gemm_exact() -> bool:
    """Whether `torch._int_mm` computes exact int32 products on this CPU. oneDNN's int8 GEMM adds
    pairs of u8*s8 products in 16 bits on CPUs without VNNI: measured on a Zen 4 with oneDNN held
    to AVX2, AVX2_VNNI or AVX512_CORE (ONEDNN_MAX_CPU_ISA) it was wrong on random int8 values,
    right with AVX512_CORE_VNNI. Checked once per process on values that saturate 16 bits."""
    g = torch.Generator().manual_seed(0)
    extreme = torch.full((PROMPT_ROWS, 256), 127, dtype=torch.int8)
    extreme[:, ::2] = -127
    pairs = [(extreme, torch.full((256, 64), -127, dtype=torch.int8))]
    for rows, cols in ((PROMPT_ROWS, 256), (64, 1000)):
        pairs.append(
            (
                torch.randint(-127, 128, (rows, cols), dtype=torch.int8, generator=g),
                torch.randint(-127, 128, (cols, 72), dtype=torch.int8, generator=g),
            )
        )
    try:
        return all(torch.equal(torch._int_mm(a, b), (a.double() @ b.double()).to(torch.int32)) for a, b in pairs)
    except RuntimeError:  # no int8 GEMM in this torch build
        return False


@functools.cache
def int8_gemm_used() -> bool:
    """Whether prompt chunks go through `torch._int_mm` on this CPU: it is exact
    (`int8_gemm_exact`) and the whole prompt path through it (`Int8Linear._int8_product`: the
    chunk quantized, the int8 GEMM, the products scaled) is faster than the dequantized one it
    replaces, in the fastest dtype this CPU's oneDNN runs (bf16 where it has bf16 units, else
    fp32). Measured once per process (a fraction of a second; where the int8 GEMM is slow the
    first timing decides): a 4096 x 1536 weight times PROMPT_TIMING_ROWS rows, best of three each
    after a warm-up, the int8 path taken where it wins by INT8_GEMM_MARGIN. Timing the GEMMs alone
    picked the int8 GEMM on a 2-core Zen 4 (AVX512-VNNI), where the int8 model at Qwen2-VL-2B's
    shape then prefilled 173-190 tok/s against 228-234 through the dequantized path. The size
    matters: at 512 x 1024 both took 0.12 ms and the answer changed from one process to the next
    (and with it the KV namespace, so KV spilled before a restart was not restored)."""
    return int8_gemm_exact() and _int8_gemm_faster()


PROMPT_TIMING_ROWS = 256


def _int8_gemm_faster() -> bool:
    from . import packed_linear

    g = torch.Generator().manual_seed(0)
    width, out = 1536, 4096
    dense = torch.bfloat16 if packed_linear.available(torch.bfloat16) else torch.float32
    frozen = lambda t: nn.Parameter(t, requires_grad=False)  # noqa: E731
    weight8 = torch.randint(-127, 128, (out, width), dtype=torch.int8, generator=g)
    layer = Int8Linear(frozen(weight8), frozen((torch.rand(out, generator=g) / 127).to(dense)), None)
    x = torch.randn(PROMPT_TIMING_ROWS, width, generator=g).to(dense)

    def seconds(run) -> float:
        t = time.perf_counter()
        run()
        return time.perf_counter() - t

    int8_product = lambda: layer._int8_product(x)  # noqa: E731
    dense_product = lambda: layer._dequantized_product(x)  # noqa: E731
    with torch.inference_mode():
        best_int8, best_dense = seconds(int8_product), seconds(dense_product)  # warm-ups
        if best_int8 > 10 * best_dense:  # no contest: spare the slow kernel's further runs
            return False
        for _ in range(3):
            best_int8 = min(best_int8, seconds(int8_product))
            best_dense = min(best_dense, seconds(dense_product))
    return best_int8 < (1 - INT8_GEMM_MARGIN) * best_dense


# How much faster the int8 prompt path must time than the dequantized one to be taken. On a 2-core
# Zen 4 (AVX512-VNNI, no AMX) it timed 1.1-1.3x the dequantized one, but on a busy host the pick
# flipped from one process to the next: the vs_llamacpp benchmark's int8 model prefilled a
# 512-token prompt at 129 tok/s in one run and 231-239 in the next; one engine switched between the
# two paths, interleaved: 143-151 tok/s through the int8 GEMM, 227-239 dequantized.
INT8_GEMM_MARGIN = 0.1


def layout() -> str:
    """LAYOUT and the prompt kernel this machine uses: both decide the KV a prompt leaves."""
    return f"{LAYOUT};prompt={'int8-gemm' if int8_gemm_used() else 'dequantized'}"


@contextlib.contextmanager
def _one_thread():
    """torch's ops on one thread inside. The int8 prompt path's passes over a chunk take 0.1-2 ms
    each on one core; split over 2 threads each one waits for both to be scheduled, which on the
    busy shared 2-core machine cost a time slice per pass: int8 ÷ bf16 prefill (4 layers at
    Qwen2-VL-2B's widths, 200 tokens, interleaved) 0.64 with the passes on 2 threads, 1.17 on
    one. Results are the same either way (exact integer sums, elementwise passes)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _fused(x: torch.Tensor, dtype: torch.dtype | None = None) -> bool:
    """Whether `_weight_int8pack_mm` serves this input with activations in `dtype` (x's own by
    default). Measured on CPU only (other devices take the plain dequantize-then-matmul path)."""
    return x.device.type == "cpu" and x.shape[-1] % FUSED_WIDTH_MULTIPLE.get(dtype or x.dtype, 8) == 0


class Int8Linear(nn.Module):
    """y = x @ (weight * scale[:, None]).T + bias, weight int8 (out, in), scale per output row
    in the compute dtype (what `_weight_int8pack_mm` takes).

    `decode_scale`: the same scales in another dtype, in which a decoded token's row goes through
    the one-row kernel while everything else computes in the compute dtype. On a 2-core AMD EPYC
    with AVX2 and no bf16 units, one row through 1536->8960 took 11.4 ms with fp32 activations and
    1.8 ms with bf16 ones, while a prompt's GEMM in bf16 ran at a fifth of fp32's: an fp32 model
    decoding through bf16 rows has both speeds (calibrate.py measures whether it pays)."""

    def __init__(
        self,
        weight: nn.Parameter,
        scale: nn.Parameter,
        bias: nn.Parameter | None,
        decode_scale: nn.Parameter | None = None,
        rows: ModuleType | None = None,
    ):
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.weight, self.scale, self.bias = weight, scale, bias
        self.decode_scale = decode_scale
        # row_kernels' compiled kernels: decoded rows go through numba's int8 kernel in fp32.
        # scale32 is a plain tensor, not a parameter: a model cast to bf16 as a whole (an int4
        # model computing in bf16: its head and embedding are int8) must not round it to bf16.
        self.rows = rows
        self.scale32 = None if rows is None else scale.detach().float().contiguous()
        self.shared_input: SharedRows | None = None  # set by join()

    def join(self, group: SharedRows, weight: torch.Tensor, scale32: torch.Tensor) -> None:
        """Hold row views of the stack `group` decodes over (shared_input.py): the same values."""
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.scale32, self.shared_input = scale32, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(self.scale.dtype).contiguous()
        if len(flat) >= PROMPT_ROWS and flat.device.type == "cpu" and int8_gemm_used():
            y = self._int8_product(flat)  # the bias added in its last pass
        else:
            decode = len(flat) < PROMPT_ROWS  # a decoded token (and its draft): the fused one-row kernel
            row = self.decode_scale
            if decode and self.rows is not None and self.scale32 is not None and flat.device.type == "cpu":
                shared = None if self.shared_input is None else self.shared_input.rows(self, x)
                if shared is None:
                    from .row_kernels import int8_rows

                    shared = int8_rows(flat, self.weight, self.scale32, self.rows)
                y = shared.to(flat.dtype)
            elif decode and row is not None and _fused(flat, row.dtype):
                y = torch._weight_int8pack_mm(flat.to(row.dtype), self.weight, row).to(flat.dtype)
            elif decode and _fused(flat):
                y = torch._weight_int8pack_mm(flat, self.weight, self.scale)
            else:
                y = self._dequantized_product(flat)
            if self.bias is not None:
                y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def _int8_product(self, flat: torch.Tensor) -> torch.Tensor:
        """x @ (weight * scale).T + bias for a prompt chunk through the int8 GEMM: each row of x
        as int8 times its own scale (amax / 127), the outlier columns (OUTLIER) in floating point.

        The GEMM runs as weight @ x.T (N x K times K x M): oneDNN's int8 GEMM threads that way
        round far better; 200 rows through 8960->1536 on the shared 2-core machine, 2 threads,
        wall time: 35 ms against 103 for x @ weight.T (56 for prepacked bf16). The passes over
        the chunk before and after it run on one thread (`_one_thread`), in fp32 (bf16
        reductions ran 10x slower here)."""
        rest = None
        with _one_thread():
            x = flat.to(torch.float32, copy=True)  # quantized in place
            magnitude = x.abs()
            column_max = magnitude.amax(0)
            outliers = (column_max > OUTLIER * column_max.median()).nonzero().flatten()
            row_scale = None
            if len(outliers) <= MAX_OUTLIERS * self.in_features:
                if len(outliers):
                    rest = x[:, outliers] @ self.weight[:, outliers].T.float()
                    x[:, outliers] = 0
                    magnitude[:, outliers] = 0
                row_scale = magnitude.amax(1, keepdim=True).div_(127)
        if row_scale is None or not bool(torch.isfinite(row_scale).all()):  # inf/NaN: the dense GEMM says so
            return self._dequantized_product(flat) + (0 if self.bias is None else self.bias)
        with _one_thread():
            x.div_(row_scale.clamp(min=torch.finfo(torch.float32).tiny)).round_()
            quantized = torch.empty((self.in_features, len(flat)), dtype=torch.int8)  # x.T, contiguous
            quantized.T.copy_(x)
        products = torch._int_mm(self.weight, quantized).T
        with _one_thread():
            y = torch.mul(products, row_scale)
            if rest is not None:
                y += rest
            out = flat.new_empty(len(flat), self.out_features)
            if self.bias is None:
                return torch.mul(y, self.scale, out=out)
            return torch.addcmul(self.bias, y, self.scale, out=out)

    def _dequantized_product(self, flat: torch.Tensor) -> torch.Tensor:
        """x @ (weight * scale).T for many rows: the int8 values (exact in bf16 and wider) turned
        into the compute dtype a slice of output rows at a time (at most DEQUANTIZED_BYTES held
        at once, so a 151936-row output head never exists in bf16 whole), multiplied by the
        dense GEMM, then scaled per output row."""
        step = max(1, DEQUANTIZED_BYTES // (self.in_features * flat.element_size()))
        if step >= self.out_features:
            return F.linear(flat, self.weight.to(flat.dtype)) * self.scale
        y = flat.new_empty(len(flat), self.out_features)
        for a in range(0, self.out_features, step):
            b = min(self.out_features, a + step)
            y[:, a:b] = F.linear(flat, self.weight[a:b].to(flat.dtype)) * self.scale[a:b]
        return y

    def extra_repr(self) -> str:
        row = "" if self.decode_scale is None else f", decoded rows in {self.decode_scale.dtype}"
        row += ", decoded rows by numba" if self.rows is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, int8{row}"


class Int8Embedding(nn.Module):
    """Token embedding from an int8 table: only the looked-up rows are scaled back."""

    def __init__(self, weight: nn.Parameter, scale: nn.Parameter):
        super().__init__()
        self.num_embeddings, self.embedding_dim = weight.shape
        self.weight, self.scale = weight, scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight).to(self.scale.dtype) * self.scale[ids].unsqueeze(-1)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, int8"


def _frozen(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.contiguous(), requires_grad=False)


def _rows(int8_tensor, dtype: torch.dtype) -> tuple[nn.Parameter, nn.Parameter]:
    """(int8 values, per-row scales in `dtype`) of a torchao per-row symmetric Int8Tensor."""
    rows, cols = int8_tensor.qdata.shape
    if list(int8_tensor.block_size) != [1, cols] or (
        int8_tensor.zero_point is not None and bool(int8_tensor.zero_point.any())
    ):
        raise ValueError(f"expected per-row symmetric int8, got block {int8_tensor.block_size}")
    return _frozen(int8_tensor.qdata), _frozen(int8_tensor.scale.reshape(rows).to(dtype))


def _quantize_rows(weight: torch.Tensor, dtype: torch.dtype) -> tuple[nn.Parameter, nn.Parameter]:
    from torchao.quantization import Int8Tensor
    from torchao.quantization.granularity import PerRow

    return _rows(Int8Tensor.from_hp(weight.detach(), PerRow()), dtype)


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, new)


def pack_int8(
    model: PreTrainedModel,
    skip: tuple[str, ...],
    dtype: torch.dtype,
    decode_dtype: torch.dtype | None = None,
    rows: ModuleType | None = None,
) -> None:
    """Swap torchao's int8 linears for Int8Linear, and quantize the token embedding and the
    output head (one shared table when tied). Modules under `skip` (the vision encoder and
    projector) are never touched. `decode_dtype`: the linears' decoded rows run in it (Int8Linear's
    decode_scale) when it is not `dtype`; `rows`: through row_kernels' numba kernel instead."""

    def linear(weight: nn.Parameter, scale: nn.Parameter, bias: nn.Parameter | None) -> Int8Linear:
        row = None if decode_dtype in (None, dtype) or rows is not None else _frozen(scale.detach().to(decode_dtype))
        return Int8Linear(weight, scale, bias, row, rows)

    from torchao.quantization import Int8Tensor

    names = {id(m): n for n, m in model.named_modules()}
    outside = lambda n: not n.startswith(tuple(p + "." for p in skip))  # noqa: E731
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    table, table_of = None, 0  # the embedding's int8 table, and the storage of the weight it was made from
    if type(embed) is nn.Embedding and outside(names[id(embed)]):
        table, table_of = _quantize_rows(embed.weight, dtype), embed.weight.data_ptr()
        _replace(model, names[id(embed)], Int8Embedding(*table))
    if type(head) is nn.Linear and outside(names[id(head)]) and not isinstance(head.weight, Int8Tensor):
        if table is not None and head.weight.data_ptr() == table_of:
            weight, scale = table  # tied: one shared table
        else:
            weight, scale = _quantize_rows(head.weight, dtype)
        _replace(model, names[id(head)], linear(weight, scale, head.bias))
    for name, module in list(model.named_modules()):
        if type(module) is nn.Linear and outside(name) and isinstance(module.weight, Int8Tensor):
            _replace(model, name, linear(*_rows(module.weight, dtype), module.bias))
