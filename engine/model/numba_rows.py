"""The one-row kernels themselves, compiled by numba (imported only through row_kernels.py, which
points numba's on-disk cache at the data folder before this module's functions are defined).

Every kernel computes out[r, j] = dot(x[r], w[j]) (times the row's scale where the format has one)
for a few rows r of activations in fp32 against weights kept as loaded. The output rows are split
across threads (`prange`); the dot product is one plain loop that LLVM vectorizes (fastmath lets
it keep several partial sums): its order depends only on the row's length, never on how many rows
came with it, so a row computes the same alone and inside a draft (checked by tests).

Measured on a 2-core AMD EPYC with AVX2 (znver3), one row, CPU time, weights in cache: int4 as
below 10.5 G weights/s per core, where the same loop in int32 lanes ran 6.7 and the block-at-a-time
loop over bytes (`for b: for i in range(16)`, indices computed from b) ran 0.4-0.5: numba keeps a
computed index's negative wraparound check, which stops LLVM vectorizing, and promotes int32
products to int64 lanes.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir  # type: ignore[import-untyped]
from numba import njit, prange, types
from numba.extending import intrinsic

# output rows split across threads; fastmath: LLVM may keep several partial sums (vectorized loops)
parallel = njit(parallel=True, fastmath=True, cache=True, nogil=True, boundscheck=False)
serial = njit(fastmath=True, cache=True, nogil=True, boundscheck=False)


@intrinsic
def _bf16_to_f32(typingctx, bits):
    """A bf16's 16 bits (as int16/uint16) to its fp32 value: the bits shifted to the top half."""
    if not isinstance(bits, types.Integer) or bits.bitwidth != 16:
        return None

    def codegen(context, builder, signature, args):
        wide = builder.zext(args[0], ir.IntType(32))
        return builder.bitcast(builder.shl(wide, ir.Constant(ir.IntType(32), 16)), ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def _f16_to_f32(typingctx, bits):
    """An IEEE half's 16 bits to fp32 (one vcvtph2ps per 8 values where the CPU has F16C)."""
    if not isinstance(bits, types.Integer) or bits.bitwidth != 16:
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(bits), codegen


# One output row's products per format (inlined into a parallel and a serial kernel, so both
# compute a row with the very same loop).


@serial
def _f32(x, w, out, j):
    for r in range(x.shape[0]):
        acc = np.float32(0)
        for i in range(x.shape[1]):
            acc += x[r, i] * w[j, i]
        out[r, j] = acc


@serial
def _bf16(x, w, out, j):
    """w: bf16 weights' bits (int16)."""
    for r in range(x.shape[0]):
        acc = np.float32(0)
        for i in range(x.shape[1]):
            acc += x[r, i] * _bf16_to_f32(w[j, i])
        out[r, j] = acc


@serial
def _f16(x, w, out, j):
    """w: fp16 weights' bits (int16)."""
    for r in range(x.shape[0]):
        acc = np.float32(0)
        for i in range(x.shape[1]):
            acc += x[r, i] * _f16_to_f32(w[j, i])
        out[r, j] = acc


@serial
def _int8(x, w, scale, out, j):
    """w: int8 (n, k); scale: fp32 per output row."""
    for r in range(x.shape[0]):
        acc = np.float32(0)
        for i in range(x.shape[1]):
            acc += x[r, i] * np.float32(w[j, i])
        out[r, j] = acc * scale[j]


# Output rows split across threads (`prange`) in chunks of CHUNK rows, and the same on the calling
# thread alone for small weights: a parallel call costs a hand-off to numba's threads (60-80 us on
# the shared 2-core EPYC, where 1536 x 256 fp32 weights take 33 us on one thread). In chunks: one
# row per prange iteration streamed fp32 weights at 19-25 GB/s, chunks of 64 rows at 31-32 (the
# same 2-core EPYC, quiet, memory 26-30 GB/s by torch's sum, Qwen2-VL-2B's linears).
CHUNK = 64


@parallel
def rows_f32(x, w, out):
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        for j in range(c * CHUNK, min(n, c * CHUNK + CHUNK)):
            _f32(x, w, out, j)


@serial
def rows_f32_serial(x, w, out):
    for j in range(w.shape[0]):
        _f32(x, w, out, j)


@parallel
def rows_bf16(x, w, out):
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        for j in range(c * CHUNK, min(n, c * CHUNK + CHUNK)):
            _bf16(x, w, out, j)


@serial
def rows_bf16_serial(x, w, out):
    for j in range(w.shape[0]):
        _bf16(x, w, out, j)


@parallel
def rows_f16(x, w, out):
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        for j in range(c * CHUNK, min(n, c * CHUNK + CHUNK)):
            _f16(x, w, out, j)


@serial
def rows_f16_serial(x, w, out):
    for j in range(w.shape[0]):
        _f16(x, w, out, j)


@parallel
def rows_int8(x, w, scale, out):
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        for j in range(c * CHUNK, min(n, c * CHUNK + CHUNK)):
            _int8(x, w, scale, out, j)


@serial
def rows_int8_serial(x, w, scale, out):
    for j in range(w.shape[0]):
        _int8(x, w, scale, out, j)


@serial
def _int4(lo, hi, xd, q, d, out, g, s):
    """Output rows g * R .. g * R + R - 1 for every activation row, in int8 x int4 blocks of 32
    (llama.cpp's Q4_0 x Q8_0).

    q: uint8 (groups, 16, R * blocks): R output rows side by side, byte [g, i, c] holding weight i
    (low nibble) and i + 16 (high) of block c % blocks of output row g * R + c // blocks, each
    0..15 standing for -8..7; d: their fp16 scales' bits, int16 (groups, R, blocks). lo, hi: int16
    (m, 16, R * blocks), each activation row's int8 values matching the low and high nibbles,
    repeated R times; xd: fp32 (m, blocks), the activation blocks' scales. out: (m, groups * R);
    s: int16 scratch (R * blocks). A block's 32 products sum to at most 32 * 8 * 127 = 32512 in
    magnitude, so 16-bit lanes are exact: 16 per AVX2 instruction. R rows side by side make the
    vectorized loop long enough to run at speed (1536 wide, 48 blocks, one row: 10.6 G weights/s
    a core, 8960 wide 17.2; 2-core AVX2 EPYC, in cache)."""
    width = q.shape[2]
    per, blocks = d.shape[1], d.shape[2]
    sums = s.reshape(per, blocks)
    for r in range(lo.shape[0]):
        for c in range(width):
            s[c] = 0
        for i in range(16):
            for c in range(width):
                v = np.int16(q[g, i, c])
                s[c] = np.int16(s[c] + np.int16((v & 15) - 8) * lo[r, i, c] + np.int16((v >> 4) - 8) * hi[r, i, c])
        for jj in range(per):
            acc = np.float32(0)
            for b in range(blocks):
                acc += np.float32(sums[jj, b]) * (_f16_to_f32(d[g, jj, b]) * xd[r, b])
            out[r, g * per + jj] = acc


@parallel
def rows_int4(lo, hi, xd, q, d, out):
    groups = q.shape[0]
    size = max(1, CHUNK // d.shape[1])  # groups of `per` rows in a chunk of about CHUNK rows
    for c in prange((groups + size - 1) // size):
        s = np.empty(q.shape[2], np.int16)
        for g in range(c * size, min(groups, c * size + size)):
            _int4(lo, hi, xd, q, d, out, g, s)


@serial
def rows_int4_serial(lo, hi, xd, q, d, out):
    s = np.empty(q.shape[2], np.int16)
    for g in range(q.shape[0]):
        _int4(lo, hi, xd, q, d, out, g, s)


@njit(cache=True, nogil=True, boundscheck=False)  # no fastmath: x / 127 and 1 / scale exactly as torch's
def quantize_int4_activations(x, lo, hi, xd):
    """x: fp32 (m, k) -> int8 values per block of 32 (x times 1 / scale, scale = amax / 127,
    rounded half to even: as row_kernels.fake_quantized_activations computes a prompt's) in lo/hi
    (m, 16, per * blocks) int16, repeated `per` times as rows_int4 reads them, and the scales in
    xd (m, blocks). Zero past k."""
    m, k = x.shape
    blocks = xd.shape[1]
    per = lo.shape[2] // blocks
    for r in range(m):
        for b in range(blocks):
            amax = np.float32(0)
            for i in range(32):
                c = b * 32 + i
                if c < k:
                    amax = max(amax, abs(x[r, c]))
            scale = amax / np.float32(127)
            xd[r, b] = scale
            inverse = np.float32(1) / scale if scale > 0 else np.float32(0)
            for i in range(16):
                c = b * 32 + i
                low = np.int16(np.round(x[r, c] * inverse)) if c < k else np.int16(0)
                high = np.int16(np.round(x[r, c + 16] * inverse)) if c + 16 < k else np.int16(0)
                for p in range(per):
                    lo[r, i, p * blocks + b] = low
                    hi[r, i, p * blocks + b] = high


@parallel
def dequantize_int4(q, d, first, out):
    """Groups first.. of rows_int4's weights back to fp32 for a prompt's GEMM, in the order they
    are stored: out (rows, 2, 16, blocks) holds (low nibble's value, high's) x position in the
    block x block, so every loop reads and writes contiguously; the prompt's activations are put
    in the same order (row_kernels.Int4Linear)."""
    per, blocks = d.shape[1], d.shape[2]
    groups = out.shape[0] // per
    for gg in prange(groups):
        g = first + gg
        values = q[g].reshape(16, per, blocks)
        for jj in range(per):
            row = gg * per + jj
            for i in range(16):
                for b in range(blocks):
                    v = np.int16(values[i, jj, b])
                    scale = _f16_to_f32(d[g, jj, b])
                    out[row, 0, i, b] = np.float32((v & 15) - 8) * scale
                    out[row, 1, i, b] = np.float32((v >> 4) - 8) * scale
