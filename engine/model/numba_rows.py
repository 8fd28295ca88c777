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


@parallel
def rows_f32(x, w, out):
    m, k = x.shape
    for j in prange(w.shape[0]):
        for r in range(m):
            acc = np.float32(0)
            for i in range(k):
                acc += x[r, i] * w[j, i]
            out[r, j] = acc


@parallel
def rows_bf16(x, w, out):
    """w: bf16 weights' bits (int16)."""
    m, k = x.shape
    for j in prange(w.shape[0]):
        for r in range(m):
            acc = np.float32(0)
            for i in range(k):
                acc += x[r, i] * _bf16_to_f32(w[j, i])
            out[r, j] = acc


@parallel
def rows_f16(x, w, out):
    """w: fp16 weights' bits (int16)."""
    m, k = x.shape
    for j in prange(w.shape[0]):
        for r in range(m):
            acc = np.float32(0)
            for i in range(k):
                acc += x[r, i] * _f16_to_f32(w[j, i])
            out[r, j] = acc


@parallel
def rows_int8(x, w, scale, out):
    """w: int8 (n, k); scale: fp32 per output row."""
    m, k = x.shape
    for j in prange(w.shape[0]):
        for r in range(m):
            acc = np.float32(0)
            for i in range(k):
                acc += x[r, i] * np.float32(w[j, i])
            out[r, j] = acc * scale[j]


@serial
def _int4_row(lo, hi, xd, q, d, s):
    """One weight row's dot with one activation row in 4-bit x int8 blocks of 32.

    q: the row's nibbles, uint8 (16, blocks): byte [i, b] holds weight i (low) and i + 16 (high)
    of block b, each 0..15 standing for -8..7; d: the blocks' fp16 scales (bits); lo, hi: int16
    (16, blocks), the activation row's int8 values matching the low and high nibbles; xd: fp32
    per block. s: int16 scratch (blocks). A block's 32 products sum to at most 32 * 8 * 127 =
    32512 in magnitude, so 16-bit lanes are exact; 16 of them per AVX2 instruction."""
    blocks = q.shape[1]
    for b in range(blocks):
        s[b] = 0
    for i in range(16):
        for b in range(blocks):
            v = np.int16(q[i, b])
            s[b] = np.int16(s[b] + np.int16((v & 15) - 8) * lo[i, b] + np.int16((v >> 4) - 8) * hi[i, b])
    acc = np.float32(0)
    for b in range(blocks):
        acc += np.float32(s[b]) * (_f16_to_f32(d[b]) * xd[b])
    return acc


@parallel
def rows_int4(lo, hi, xd, q, d, out):
    """q: uint8 (n, 16, blocks); d: int16 (n, blocks) fp16 bits; lo, hi: int16 (m, 16, blocks);
    xd: fp32 (m, blocks). Output rows in chunks of 16 per thread task (one scratch each)."""
    n, m = q.shape[0], lo.shape[0]
    chunks = (n + 15) // 16
    for c in prange(chunks):
        s = np.empty(q.shape[2], np.int16)
        for j in range(c * 16, min(n, c * 16 + 16)):
            for r in range(m):
                out[r, j] = _int4_row(lo[r], hi[r], xd[r], q[j], d[j], s)
