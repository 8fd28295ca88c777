"""The one-row kernels themselves, compiled by numba (imported only through row_kernels.py, which
points numba's on-disk cache at the data folder before this module's functions are defined).

Every kernel computes out[r, j] = dot(x[r], w[j]) (times the row's scale where the format has one)
for a few rows r of activations against weights kept as loaded. The output rows are split across
threads (`prange`). The dot product is either a plain loop that LLVM vectorizes (fastmath lets it
keep several partial sums), one per span of SPAN_BYTES for int8, bf16 and fp16 weights (_spans),
or one intrinsic that writes the vector code itself (fp32 rows, bf16 rows on CPUs with bf16 dot
products, int8 and int4 on integer dot products: _dot_row, _q8_dot, _q4_dot). Either way its
order depends only on the row's length, never on how many rows came with it, so a row computes
the same alone and inside a draft (checked by tests).

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
from numba.core import cgutils
from numba.extending import intrinsic

# output rows split across threads; fastmath: LLVM may keep several partial sums (vectorized loops)
parallel = njit(parallel=True, fastmath=True, cache=True, nogil=True, boundscheck=False)
serial = njit(fastmath=True, cache=True, nogil=True, boundscheck=False)


def _bf16_bits(builder, v):
    """A bf16's 16 bits to its fp32 value: the bits shifted to the top half."""
    wide = builder.zext(v, ir.IntType(32))
    return builder.bitcast(builder.shl(wide, ir.Constant(ir.IntType(32), 16)), ir.FloatType())


def _f16_bits(builder, v):
    """An IEEE half's 16 bits to fp32 (one vcvtph2ps per 8 values where the CPU has F16C)."""
    if "f16c" in target_features() or not _x86():
        return builder.fpext(builder.bitcast(v, ir.HalfType()), ir.FloatType())
    # Without F16C LLVM calls __extendhfsf2, which numba's JIT does not link: the process
    # aborted ("LLVM ERROR: Symbol not found", numba told to compile for a plain x86-64). The
    # bits moved into fp32's places, times 2^112 (exact, subnormals included); 31 is inf/NaN.
    i32 = ir.IntType(32)
    h = builder.zext(v, i32)
    moved = builder.shl(builder.and_(h, ir.Constant(i32, 0x7FFF)), ir.Constant(i32, 13))
    finite = builder.fmul(builder.bitcast(moved, ir.FloatType()), ir.Constant(ir.FloatType(), 2.0**112))
    special = builder.icmp_unsigned(">=", moved, ir.Constant(i32, 0x7C00 << 13))
    bits = builder.select(special, builder.or_(moved, ir.Constant(i32, 0x7F800000)), builder.bitcast(finite, i32))
    sign = builder.shl(builder.and_(h, ir.Constant(i32, 0x8000)), ir.Constant(i32, 16))
    return builder.bitcast(builder.or_(bits, sign), ir.FloatType())


@intrinsic
def _f16_to_f32(typingctx, bits):
    """An IEEE half's 16 bits (as int16/uint16) to fp32."""
    if not isinstance(bits, types.Integer) or bits.bitwidth != 16:
        return None
    return types.float32(bits), lambda context, builder, signature, args: _f16_bits(builder, args[0])


@intrinsic
def _to_f32(typingctx, value):
    """A weight to fp32, its format told by its type: int8 a value, int16 a bf16's bits, uint16 an
    IEEE half's (row_kernels.kernel_weight passes each weight so): one row loop for all three."""
    if not isinstance(value, types.Integer) or value.bitwidth not in (8, 16):
        return None
    if value.bitwidth == 8:
        widen = lambda builder, v: builder.sitofp(v, ir.FloatType())  # noqa: E731
    else:
        widen = _f16_bits if not value.signed else _bf16_bits
    return types.float32(value), lambda context, builder, signature, args: widen(builder, args[0])


# How far ahead of the row being computed the kernels ask for weight bytes (a software prefetch).
# The CPU's own prefetcher did not keep up: on a 2-core Xeon (Sapphire Rapids class, torch's sum
# 31 GB/s) int4 weights streamed from memory at 8.2 GB/s on one core and 13.6 on two, int8 at 8.0
# and 13.0; asking 6-24 KB ahead, 14.1 and 21-23 (int4), 11-12 and 18 (int8), and the int4 model
# at Qwen2-VL-2B's shape decoded 8.6 -> 11.3 tok/s. The arithmetic is the same either way.
AHEAD = 8192


@intrinsic
def _prefetch(typingctx, array, offset):
    """Ask the CPU to start reading the cache line `offset` bytes past the array's start (a hint:
    no fault, no effect on results, wherever it points)."""
    if not isinstance(array, types.Array) or not isinstance(offset, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        at = context.cast(builder, args[1], signature.args[1], types.intp)
        _prefetch_at(builder, builder.gep(builder.bitcast(data, _I8.as_pointer()), [at]))
        return context.get_dummy_value()

    return types.void(array, offset), codegen


def _prefetch_at(builder, pointer):
    i32 = ir.IntType(32)
    fn = _declare(builder.module, "llvm.prefetch.p0i8", ir.VoidType(), [_I8.as_pointer(), i32, i32, i32])
    builder.call(fn, [pointer, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])


@serial
def _ahead(w, j):
    """Weight row j's bytes AHEAD bytes further on, on their way to the cache while row j computes."""
    size = w.shape[1] * w.itemsize
    start = j * size + AHEAD
    for b in range(0, size, 64):
        _prefetch(w, start + b)


def _x86() -> bool:
    import platform

    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686", "x86")


# One output row's products per format (inlined into a parallel and a serial kernel, so both
# compute a row with the very same loop).


# fp32 rows as wide as a whole number of F32_BLOCK go through one intrinsic (_dot_row: four
# accumulators of 16 lanes, each line of the next row asked for as this one's is read); the plain
# loop below, whose vectorizing was left to LLVM, streamed 32.9 GB/s where it streams 38.2 (2-core
# AMD EPYC VM, Zen 4, torch's sum 41.5 GB/s, Qwen2-VL-2B's seven linears in copies filling 1 GiB,
# one row, 2 threads, best of 8 interleaved).
F32_BLOCK = 16


@serial
def _f32(x, w, out, j):
    if w.shape[1] % F32_BLOCK == 0:
        for r in range(x.shape[0]):
            _f32_dot(w, x, out, j, r)
        return
    _ahead(w, j)
    for r in range(x.shape[0]):
        acc = np.float32(0)
        for i in range(x.shape[1]):
            acc += x[r, i] * w[j, i]
        out[r, j] = acc


# int8, bf16 and fp16 rows are computed in spans of SPAN_BYTES of weights, each span's bytes
# SPAN_AHEAD further on asked for just before it: a whole row's worth asked for at once (as _ahead
# does) left long rows waiting on memory. Measured (2-core AMD EPYC VM, Zen 4, torch's sum 49-58
# GB/s, 2 threads, weights streamed from memory, median of 8): int8 1536 x 8960 (Qwen2-VL-2B's
# down projection, 8.75 KB rows) 23.1 -> 42.8 GB/s, 8960 x 1536 and 1536 x 1536 unchanged (46-47,
# 44-45); bf16 29.6 -> 39.9, 41.5 -> 46.5, 41.7 -> 47.3. fp32 gained nothing (44-45 either way)
# and keeps whole rows. A span's sum is added to the row's in order: the order still depends only
# on the row's length.
SPAN_BYTES = 1024
SPAN_AHEAD = 4096


@serial
def _span_ahead(w, j, lo, hi):
    """Weight row j's bytes of elements lo..hi, SPAN_AHEAD bytes further on."""
    size = w.itemsize
    start = (j * w.shape[1] + lo) * size + SPAN_AHEAD
    for b in range(0, (hi - lo) * size, 64):
        _prefetch(w, start + b)


@serial
def _spans(x, w, out, j, scale):
    """out[r, j] = dot(x[r], w[j]) * scale for int8 values or bf16/fp16 bits (_to_f32), span by
    span (scale 1 for bf16/fp16: exact)."""
    k = w.shape[1]
    span = SPAN_BYTES // w.itemsize
    for r in range(x.shape[0]):
        total = np.float32(0)
        for lo in range(0, k, span):
            hi = min(k, lo + span)
            if r == 0:
                _span_ahead(w, j, lo, hi)
            xs, ws = x[r, lo:hi], w[j, lo:hi]
            acc = np.float32(0)
            for i in range(xs.shape[0]):
                acc += xs[i] * _to_f32(ws[i])
            total += acc
        out[r, j] = total * scale


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
def rows_half(x, w, out):
    """bf16 (int16 bits) or fp16 (uint16 bits) weights: numba compiles one kernel for each."""
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        for j in range(c * CHUNK, min(n, c * CHUNK + CHUNK)):
            _spans(x, w, out, j, np.float32(1))


@serial
def rows_half_serial(x, w, out):
    for j in range(w.shape[0]):
        _spans(x, w, out, j, np.float32(1))


@parallel
def rows_int8(x, w, scale, out):
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        for j in range(c * CHUNK, min(n, c * CHUNK + CHUNK)):
            _spans(x, w, out, j, scale[j])


@serial
def rows_int8_serial(x, w, scale, out):
    for j in range(w.shape[0]):
        _spans(x, w, out, j, scale[j])


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
    start = g * 16 * width + AHEAD
    for b in range(0, 16 * width, 64):
        _prefetch(q, start + b)
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


# ------------------------------------------------- int4 through the CPU's integer dot instructions
#
# The same Q4_0 x Q8_0 product as rows_int4, in a layout for the CPU's byte dot products: one output
# row's weights in pairs of blocks, byte i of pair p holding weight i of block 2p (low nibble) and
# of block 2p + 1 (high), 0..15; the activations int8 in their own order. A block's products come
# from vpdpbusd (AVX512-VNNI, 512 or 256 bits; AVX-VNNI) or vpmaddubsw + vpmaddwd (AVX2): unsigned
# nibble times signed activation, into 8 int32 lanes started at the activation block's share of
# -8 * sum(x) (so the lanes sum to the block's exact integer), then fp32 times the block's two
# scales, into one accumulator per block of a pair. The 512- and 256-bit paths do the same
# arithmetic in the same order, so they agree to the bit; the order depends only on the row's length.
# numba has no vector types, so a row's whole loop is one intrinsic that emits the LLVM IR; an
# intrinsic refuses to compile (a TypingError, not LLVM's abort) on a CPU numba's target lacks.
# Measured (2-core AMD EPYC znver4 with AVX512-VNNI, shared machine, one core, CPU time, best of
# 25, 512 x 1536 weights in L2): 512 bits 48.3 G weights/s, AVX2 44.3 (in cache; four rows a dot then, four
# pairs' scales converted at once; one row and scales one pair at a time: 36.0 and 35.2); the
# generic rows_int4 on 8960 x 1536: 21.4 (10.5 by wall time on the same machine, busier).

_I8, _I16, _I32, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()
Q4_PATHS = ("vnni512", "vnni256", "avx2")  # fastest first (measured above); else rows_int4
_NEEDS = {
    "vnni512": ({"avx512f", "avx512bw", "avx512vnni"},),
    "vnni256": ({"avx2", "avxvnni", "fma", "f16c"}, {"avx512f", "avx512vl", "avx512vnni"}),
    "avx2": ({"avx2", "fma", "f16c"},),
}


def target_features() -> set[str]:
    """The CPU features numba compiles for (its target machine's: the host's unless
    NUMBA_CPU_FEATURES says otherwise), the same string its on-disk cache is keyed on."""
    from numba.core.registry import cpu_target

    features = cpu_target.target_context.codegen()._tm_features  # noqa: SLF001 - numba's own choice
    return {f[1:] for f in features.split(",") if f.startswith("+")}


def q4_paths(features: set[str] | None = None) -> list[str]:
    """The int-dot int4 paths this CPU runs, fastest first (empty: rows_int4 only)."""
    have = target_features() if features is None else features
    return [p for p in Q4_PATHS if any(need <= have for need in _NEEDS[p])]


def _vector(t, n):
    return ir.VectorType(t, n)


def _constant(t, values):
    return ir.Constant(_vector(t, len(values)), [ir.Constant(t, v) for v in values])


def _declare(module, name, ret, args):
    try:
        return module.get_global(name)
    except KeyError:
        return ir.Function(module, ir.FunctionType(ret, args), name=name)


def _load(builder, base, index, t, n):
    return builder.load(builder.bitcast(builder.gep(base, [index]), _vector(t, n).as_pointer()), align=1)


def _lane_sum(builder, acc, lanes: int):
    """The sum of a vector's `lanes` fp32 lanes by a fixed tree of additions (halves added until
    one lane is left): the same order on every call, so a row's sum never depends on its company."""
    n = lanes
    while n > 1:
        n //= 2
        lo = builder.shuffle_vector(acc, acc, _constant(_I32, list(range(n))))
        hi = builder.shuffle_vector(acc, acc, _constant(_I32, list(range(n, 2 * n))))
        acc = builder.fadd(lo, hi)
    return builder.extract_element(acc, ir.Constant(_I32, 0))


def _at(builder, index, n):
    return builder.mul(index, ir.Constant(index.type, n))


def _q4_dot(path: str):
    """An intrinsic dot(q, s, xq, bias, xd, out, j, r): out[r, j] = weight row j of q (uint8
    nibbles, n x pairs * 32) and s (fp16 scales' bits, n x pairs * 2) against activation row r of
    xq (int8, m x pairs * 64), bias (int32, m x pairs * 16: lane 0 of each 8 is the block's
    -8 * sum(x)) and xd (fp32 scales, m x pairs * 2); all C-contiguous."""

    @intrinsic
    def dot(typingctx, q, s, xq, bias, xd, out, j, r):
        if not any(need <= target_features() for need in _NEEDS[path]):
            return None  # a TypingError where this CPU lacks the instructions
        arrays = (q, s, xq, bias, xd, out)
        if not all(isinstance(t, types.Array) and t.ndim == 2 and t.layout == "C" for t in arrays):
            return None
        signature = types.void(q, s, xq, bias, xd, out, j, r)

        def codegen(context, builder, sig, args):
            parts = [context.make_array(t)(context, builder, v) for t, v in zip(sig.args[:6], args[:6], strict=True)]
            width = [cgutils.unpack_tuple(builder, part.shape)[1] for part in parts]
            row, col = (context.cast(builder, v, t, types.intp) for v, t in zip(args[6:], sig.args[6:], strict=True))
            qp, sp = (builder.gep(parts[k].data, [builder.mul(row, width[k])]) for k in (0, 1))
            xp, bp, dp = (builder.gep(parts[k].data, [builder.mul(col, width[k])]) for k in (2, 3, 4))
            op = builder.gep(parts[5].data, [builder.add(builder.mul(col, width[5]), row)])
            wide = 16 if path == "vnni512" else 8
            module = builder.module
            fma = _declare(module, f"llvm.fma.v{wide}f32", _vector(_F32, wide), [_vector(_F32, wide)] * 3)
            zero = ir.Constant(_vector(_F32, wide), [ir.Constant(_F32, 0.0)] * wide)
            accs = [cgutils.alloca_once_value(builder, zero) for _ in range(16 // wide)]
            pairs = builder.udiv(width[0], ir.Constant(width[0].type, 32))

            def step(p, pair_scales):
                """Pair p; pair_scales: its two block scales (weight's x activation's)."""
                xs, bs = builder.gep(xp, [_at(builder, p, 64)]), builder.gep(bp, [_at(builder, p, 16)])
                if wide == 16:
                    xv = builder.bitcast(_load(builder, xs, _at(builder, p, 0), _I8, 64), _vector(_I32, 16))
                    starts = [_load(builder, bs, _at(builder, p, 0), _I32, 16)]
                else:
                    xv = [_load(builder, xs, ir.Constant(p.type, 32 * h), _I8, 32) for h in range(2)]
                    starts = [_load(builder, bs, ir.Constant(p.type, 8 * h), _I32, 8) for h in range(2)]
                nibbles = _load(builder, builder.gep(qp, [_at(builder, p, 32)]), ir.Constant(p.type, 0), _I8, 32)
                _pair(builder, path, module, fma, accs, nibbles, pair_scales, xv, starts)

            def scales(p, n):
                """The scales of n blocks from pair p on, times the activation's (exact fp16 to fp32,
                one rounded product each: the same values however many come at once)."""
                at = builder.gep(sp, [_at(builder, p, 2)])
                halves = _load(builder, at, ir.Constant(p.type, 0), _I16, n)
                halves = builder.fpext(builder.bitcast(halves, _vector(ir.HalfType(), n)), _vector(_F32, n))
                return builder.fmul(halves, _load(builder, dp, _at(builder, p, 2), _F32, n))

            # four pairs a turn, their 8 scales converted at once (one instruction, not four), the rest one by one
            quads = builder.udiv(pairs, ir.Constant(pairs.type, 4))
            with cgutils.for_range(builder, quads) as loop:
                first = _at(builder, loop.index, 4)
                at = _at(builder, first, 32)  # these 4 pairs' bytes AHEAD on (scales: an eighth as far)
                for extra in (AHEAD, AHEAD + 64):
                    _prefetch_at(builder, builder.gep(qp, [builder.add(at, ir.Constant(at.type, extra))]))
                line = builder.gep(sp, [builder.add(_at(builder, first, 2), ir.Constant(first.type, AHEAD // 16))])
                _prefetch_at(builder, builder.bitcast(line, _I8.as_pointer()))
                eight = scales(first, 8)
                for u in range(4):
                    pick = _constant(_I32, [2 * u, 2 * u + 1])
                    step(builder.add(first, ir.Constant(first.type, u)), builder.shuffle_vector(eight, eight, pick))
            with cgutils.for_range(builder, builder.sub(pairs, _at(builder, quads, 4)), intp=pairs.type) as loop:
                p = builder.add(_at(builder, quads, 4), loop.index)
                step(p, scales(p, 2))
            acc = builder.load(accs[0])
            if len(accs) == 2:  # the 512-bit path's first step below adds the same halves
                acc = builder.fadd(acc, builder.load(accs[1]))
            builder.store(_lane_sum(builder, acc, wide), op)
            return context.get_dummy_value()

        return signature, codegen

    return dot


def _pair(builder, path, module, fma, accs, nibbles, scales, xv, starts):
    """One pair of blocks of one weight row into its accumulators."""
    if path == "vnni512":
        both = builder.shuffle_vector(nibbles, nibbles, _constant(_I32, list(range(32)) * 2))
        shifted = builder.lshr(builder.bitcast(both, _vector(_I16, 32)), _constant(_I16, [0] * 16 + [4] * 16))
        values = builder.and_(builder.bitcast(shifted, _vector(_I8, 64)), _constant(_I8, [15] * 64))
        fn = _declare(module, "llvm.x86.avx512.vpdpbusd.512", _vector(_I32, 16), [_vector(_I32, 16)] * 3)
        sums = builder.call(fn, [starts[0], builder.bitcast(values, _vector(_I32, 16)), xv])
        spread = builder.shuffle_vector(scales, scales, _constant(_I32, [0] * 8 + [1] * 8))
        products = builder.call(fma, [builder.sitofp(sums, _vector(_F32, 16)), spread, builder.load(accs[0])])
        builder.store(products, accs[0])
        return
    mask = _constant(_I8, [15] * 32)
    low = builder.and_(nibbles, mask)
    shifted = builder.lshr(builder.bitcast(nibbles, _vector(_I16, 16)), _constant(_I16, [4] * 16))
    high = builder.and_(builder.bitcast(shifted, _vector(_I8, 32)), mask)
    for h, values in enumerate((low, high)):
        if path == "vnni256":
            fn = _declare(module, "llvm.x86.avx512.vpdpbusd.256", _vector(_I32, 8), [_vector(_I32, 8)] * 3)
            i32s = [builder.bitcast(v, _vector(_I32, 8)) for v in (values, xv[h])]
            sums = builder.call(fn, [starts[h], *i32s])
        else:  # pairs of products in int16 (at most 2 * 15 * 128: no saturation), then pairs of those
            ubsw = _declare(module, "llvm.x86.avx2.pmadd.ub.sw", _vector(_I16, 16), [_vector(_I8, 32)] * 2)
            wd = _declare(module, "llvm.x86.avx2.pmadd.wd", _vector(_I32, 8), [_vector(_I16, 16)] * 2)
            pairs16 = builder.call(ubsw, [values, xv[h]])
            sums = builder.add(builder.call(wd, [pairs16, _constant(_I16, [1] * 16)]), starts[h])
        spread = builder.shuffle_vector(scales, scales, _constant(_I32, [h] * 8))
        products = builder.call(fma, [builder.sitofp(sums, _vector(_F32, 8)), spread, builder.load(accs[h])])
        builder.store(products, accs[h])


# One weight row per dot. Four rows a dot (sharing the activations' loads) ran faster in cache,
# 43.7 G weights/s a core against 36.0 (vnni512), but streamed from memory they are four streams a
# thread against one: Qwen2-VL-2B's seven linears in copies filling 1 GiB, one row, 2 threads
# (2-core AMD EPYC VM, Zen 4, torch's sum 40.5-43.6 GB/s, 6 interleaved rounds) streamed 30.9-32.1
# GB/s four rows a dot and 39.2-41.0 one, to the same bits.
_vnni512, _vnni256, _avx2 = (_q4_dot(p) for p in Q4_PATHS)

# One kernel pair per path, written out (numba caches module-level functions, not closures); each
# compiles on its first call only, so a CPU never compiles a path it lacks.


@parallel
def rows_q4_vnni512(xq, bias, xd, q, s, out):
    """out (m, n) = the rows' products: xq int8 (m, pairs * 64), bias int32 (m, pairs * 16), xd
    fp32 (m, pairs * 2) from quantize_q8_activations; q uint8 (n, pairs * 32), s int16 (n, pairs * 2)."""
    n = q.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        for j in range(c * CHUNK, min(n, c * CHUNK + CHUNK)):
            for r in range(xq.shape[0]):
                _vnni512(q, s, xq, bias, xd, out, j, r)


@serial
def rows_q4_vnni512_serial(xq, bias, xd, q, s, out):
    for j in range(q.shape[0]):
        for r in range(xq.shape[0]):
            _vnni512(q, s, xq, bias, xd, out, j, r)


@parallel
def rows_q4_vnni256(xq, bias, xd, q, s, out):
    n = q.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        for j in range(c * CHUNK, min(n, c * CHUNK + CHUNK)):
            for r in range(xq.shape[0]):
                _vnni256(q, s, xq, bias, xd, out, j, r)


@serial
def rows_q4_vnni256_serial(xq, bias, xd, q, s, out):
    for j in range(q.shape[0]):
        for r in range(xq.shape[0]):
            _vnni256(q, s, xq, bias, xd, out, j, r)


@parallel
def rows_q4_avx2(xq, bias, xd, q, s, out):
    n = q.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        for j in range(c * CHUNK, min(n, c * CHUNK + CHUNK)):
            for r in range(xq.shape[0]):
                _avx2(q, s, xq, bias, xd, out, j, r)


@serial
def rows_q4_avx2_serial(xq, bias, xd, q, s, out):
    for j in range(q.shape[0]):
        for r in range(xq.shape[0]):
            _avx2(q, s, xq, bias, xd, out, j, r)


@njit(cache=True, nogil=True, boundscheck=False)  # no fastmath: the same values as quantize_int4_activations
def quantize_q8_activations(x, xq, bias, xd):
    """x: fp32 (m, k) -> the rows_q4_* kernels' activations: int8 per block of 32 (as
    quantize_int4_activations rounds them) in xq (m, blocks * 32), each block's -8 * sum in lane 0
    of its 8 in bias (m, blocks * 8), the scales in xd (m, blocks). Zero past k."""
    m, k = x.shape
    blocks = xd.shape[1]
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
            total = 0
            for i in range(32):
                c = b * 32 + i
                v = np.int8(np.round(x[r, c] * inverse)) if c < k else np.int8(0)
                xq[r, c] = v
                total += np.int32(v)
            for i in range(8):
                bias[r, b * 8 + i] = -8 * total if i == 0 else 0


@parallel
def dequantize_q4(q, s, first, out):
    """Rows first.. of the rows_q4_* weights back to fp32 (rows, pairs * 64), in their own order."""
    pairs = q.shape[1] // 32
    for jj in prange(out.shape[0]):
        j = first + jj
        for p in range(pairs):
            for h in range(2):
                scale = _f16_to_f32(s[j, 2 * p + h])
                for i in range(32):
                    v = np.int16(q[j, 32 * p + i])
                    out[jj, 64 * p + 32 * h + i] = np.float32(((v >> (4 * h)) & 15) - 8) * scale


# ------------------------------------------------- int8 through the CPU's integer dot instructions
#
# An int8 weight row (per-row scale) times activations quantized as for int4 (int8 per block of
# 32, quantize_q8_activations): llama.cpp's q8_0 x q8_0 product. The weights are read as loaded
# (row-major int8), a pair of blocks (64 bytes) at a time. Every path computes each int32 lane
# (four products) exactly, so all three agree to the bit: vpdpbusd takes unsigned bytes, so the
# weights go in as w + 128 (w xor 0x80) and each lane starts at -128 times its four activations'
# sum; AVX2's vpmaddubsw adds pairs in 16 bits, where (w + 128) * x would saturate, so it takes
# |w| and x with w's sign (at most 2 * 128 * 127). Lanes then fp32 times the block's activation
# scale into one accumulator per block of a pair, the row's scale once at the end.
# Measured (2-core AMD EPYC, Zen 4, one core, CPU time, weights in L2, 1536- and 8960-wide rows):
# 62-67 G weights/s (vnni512), 58-59 compiled for haswell (avx2), where rows_int8 ran 21-29: it
# turns each weight into fp32 first, 3 vector instructions per 16 weights. Streamed from memory on
# 2 threads (memory 41-46 GB/s by torch's sum, medians of 15 interleaved): 44.2 vs 44.7 GB/s
# (8960 x 1536), 45.2 vs 40.0 (1536 x 8960). One row at a time: four rows a dot (int4's way until
# it was measured the same way) were faster in cache but streamed 38.5-40.7 GB/s.

Q8_PATHS = Q4_PATHS  # the same instructions, the same order
Q8_AHEAD = 4096  # prefetch: the same bytes of the next row, and this much further


def _q8_dot(path: str):
    """An intrinsic dot(w, xq, xd, scale, out, j, r): out[r, j] = weight row j of w (int8,
    n x pairs * 64) times scale[j] against activation row r of xq (int8, m x pairs * 64) and xd
    (fp32 block scales, m x pairs * 2); all C-contiguous."""

    @intrinsic
    def dot(typingctx, w, xq, xd, scale, out, j, r):
        if not any(need <= target_features() for need in _NEEDS[path]):
            return None  # a TypingError where this CPU lacks the instructions
        arrays = (w, xq, xd, out)
        if not all(isinstance(t, types.Array) and t.ndim == 2 and t.layout == "C" for t in arrays):
            return None
        if not (isinstance(scale, types.Array) and scale.ndim == 1 and scale.layout == "C"):
            return None
        signature = types.void(w, xq, xd, scale, out, j, r)

        def codegen(context, builder, sig, args):
            parts = [context.make_array(t)(context, builder, v) for t, v in zip(sig.args[:5], args[:5], strict=True)]
            width = {k: cgutils.unpack_tuple(builder, parts[k].shape)[1] for k in (0, 1, 2, 4)}
            row, col = (context.cast(builder, v, t, types.intp) for v, t in zip(args[5:], sig.args[5:], strict=True))
            wp = builder.gep(parts[0].data, [builder.mul(row, width[0])])
            xp, dp = (builder.gep(parts[k].data, [builder.mul(col, width[k])]) for k in (1, 2))
            wide = 16 if path == "vnni512" else 8
            halves = 16 // wide  # vectors a pair of blocks takes
            module = builder.module
            fma = _declare(module, f"llvm.fma.v{wide}f32", _vector(_F32, wide), [_vector(_F32, wide)] * 3)
            zero = ir.Constant(_vector(_F32, wide), [ir.Constant(_F32, 0.0)] * wide)
            accs = [cgutils.alloca_once_value(builder, zero) for _ in range(halves)]
            pairs = builder.udiv(width[0], ir.Constant(width[0].type, 64))
            ahead = builder.add(width[0], ir.Constant(width[0].type, Q8_AHEAD))
            with cgutils.for_range(builder, pairs) as loop:
                at = _at(builder, loop.index, 64)
                _prefetch_at(builder, builder.gep(wp, [builder.add(at, ahead)]))
                two = _load(builder, dp, _at(builder, loop.index, 2), _F32, 2)
                for h in range(halves):
                    offset = builder.add(at, ir.Constant(at.type, 4 * wide * h))
                    xv = _load(builder, xp, offset, _I8, 4 * wide)
                    spread = builder.shuffle_vector(
                        two, two, _constant(_I32, [0] * 8 + [1] * 8 if wide == 16 else [h] * 8)
                    )
                    sums = _q8_lanes(builder, path, module, _load(builder, wp, offset, _I8, 4 * wide), xv)
                    lanes = builder.sitofp(sums, _vector(_F32, wide))
                    builder.store(builder.call(fma, [lanes, spread, builder.load(accs[h])]), accs[h])
            acc = builder.load(accs[0])
            if halves == 2:  # the 512-bit path's first step below adds the same halves
                acc = builder.fadd(acc, builder.load(accs[1]))
            total = builder.fmul(_lane_sum(builder, acc, wide), builder.load(builder.gep(parts[3].data, [row])))
            builder.store(total, builder.gep(parts[4].data, [builder.add(builder.mul(col, width[4]), row)]))
            return context.get_dummy_value()

        return signature, codegen

    return dot


def _vpdpbusd(module, n):
    return _declare(module, f"llvm.x86.avx512.vpdpbusd.{32 * n}", _vector(_I32, n), [_vector(_I32, n)] * 3)


def _q8_lanes(builder, path, module, weights, xv):
    """Each int32 lane's four products of weight and activation bytes, exact."""
    n = weights.type.count // 4
    i32 = _vector(_I32, n)
    if path != "avx2":
        zero = ir.Constant(i32, [ir.Constant(_I32, 0)] * n)
        x32 = builder.bitcast(xv, i32)
        u128 = builder.bitcast(_constant(_I8, [-128] * (4 * n)), i32)  # byte 0x80: 128 unsigned
        start = builder.sub(zero, builder.call(_vpdpbusd(module, n), [zero, u128, x32]))  # what + 128 adds, taken off
        unsigned = builder.bitcast(builder.xor(weights, _constant(_I8, [-128] * (4 * n))), i32)
        return builder.call(_vpdpbusd(module, n), [start, unsigned, x32])
    absolute = _declare(module, "llvm.abs.v32i8", _vector(_I8, 32), [_vector(_I8, 32), ir.IntType(1)])
    sign = _declare(module, "llvm.x86.avx2.psign.b", _vector(_I8, 32), [_vector(_I8, 32)] * 2)
    magnitude = builder.call(absolute, [weights, ir.Constant(ir.IntType(1), 0)])  # |-128| is 128 unsigned
    signed = builder.call(sign, [xv, weights])  # x, -x or 0 as w is positive, negative or 0
    ubsw = _declare(module, "llvm.x86.avx2.pmadd.ub.sw", _vector(_I16, 16), [_vector(_I8, 32)] * 2)
    wd = _declare(module, "llvm.x86.avx2.pmadd.wd", _vector(_I32, 8), [_vector(_I16, 16)] * 2)
    return builder.call(wd, [builder.call(ubsw, [magnitude, signed]), _constant(_I16, [1] * 16)])


_q8_vnni512, _q8_vnni256, _q8_avx2 = (_q8_dot(p) for p in Q8_PATHS)

# Written out per path, as the int4 kernels are (numba caches module-level functions only).


@parallel
def rows_q8_vnni512(xq, xd, w, scale, out):
    """out (m, n) = the rows' products: xq int8 (m, pairs * 64) and xd fp32 (m, pairs * 2) from
    quantize_q8_activations; w int8 (n, pairs * 64) and its fp32 row scales (n,)."""
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        for j in range(c * CHUNK, min(n, c * CHUNK + CHUNK)):
            for r in range(xq.shape[0]):
                _q8_vnni512(w, xq, xd, scale, out, j, r)


@serial
def rows_q8_vnni512_serial(xq, xd, w, scale, out):
    for j in range(w.shape[0]):
        for r in range(xq.shape[0]):
            _q8_vnni512(w, xq, xd, scale, out, j, r)


@parallel
def rows_q8_vnni256(xq, xd, w, scale, out):
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        for j in range(c * CHUNK, min(n, c * CHUNK + CHUNK)):
            for r in range(xq.shape[0]):
                _q8_vnni256(w, xq, xd, scale, out, j, r)


@serial
def rows_q8_vnni256_serial(xq, xd, w, scale, out):
    for j in range(w.shape[0]):
        for r in range(xq.shape[0]):
            _q8_vnni256(w, xq, xd, scale, out, j, r)


@parallel
def rows_q8_avx2(xq, xd, w, scale, out):
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        for j in range(c * CHUNK, min(n, c * CHUNK + CHUNK)):
            for r in range(xq.shape[0]):
                _q8_avx2(w, xq, xd, scale, out, j, r)


@serial
def rows_q8_avx2_serial(xq, xd, w, scale, out):
    for j in range(w.shape[0]):
        for r in range(xq.shape[0]):
            _q8_avx2(w, xq, xd, scale, out, j, r)


# ------------------------------------------------ bf16 through the CPU's bf16 pair dot products
#
# A bf16 weight row times a bf16 activation row by vdpbf16ps (AVX512-BF16): each fp32 lane adds
# the products of a pair of bf16s, 32 weights an instruction where rows_half spends three vector
# instructions per 16 weights turning them into fp32 first. The activations must be bf16 too: in
# a bf16 model they are (a prompt chunk's F.linear takes them so), and row_kernels rounds other
# rows to bf16 before this kernel. The instruction treats subnormal inputs as zero and rounds as
# it likes, not as MXCSR says: its own arithmetic, named in the KV namespace (row_kernels.layout).
# Four accumulators, 128 weights a turn, then the leftover blocks of 32 into the first; fixed sums
# at the end: the order depends only on the row's length.
# Measured (2-core AMD EPYC VM, Zen 4, torch's sum 75-79 GB/s, Qwen2-VL-2B's seven linears in
# copies filling 1 GiB, one row, 2 threads, best of 8 interleaved): 71.6 GB/s against rows_half's
# 56.5; one core in cache (8960 x 1536): 33.2 G weights/s against 18.0.

BF16_PATHS = ("avx512bf16",)  # else rows_half (weights turned into fp32)
_NEEDS["avx512bf16"] = ({"avx512f", "avx512bf16"},)
BF16_BLOCK = 32  # weights one instruction takes: rows of other widths go through rows_half
ROW_AHEAD = 4096  # prefetch (bytes): the same bytes of the next row, and this much further


class _BFloat(ir.types._BaseFloatType):
    """LLVM's bfloat, which llvmlite's IR builder does not name (the dot instruction takes it)."""

    null = "0.0"
    intrinsic_name = "bf16"

    def __str__(self):
        return "bfloat"

    def format_constant(self, value):
        raise NotImplementedError("no bfloat constants are written")


_BFloat._create_instance()


def bf16_paths(features: set[str] | None = None) -> list[str]:
    """The bf16 dot paths this CPU runs (empty: rows_half only)."""
    have = target_features() if features is None else features
    return [p for p in BF16_PATHS if any(need <= have for need in _NEEDS[p])]


def _dot_row(kind: str):
    """An intrinsic dot(w, x, out, j, r): out[r, j] = weight row j of w times activation row r of
    x (C-contiguous, as wide as a whole number of blocks): "bf16" both as bf16 bits (int16), 32
    pairs a vdpbf16ps; "f32" both fp32, 16 a fused multiply-add (fmuladd: a multiply and an add
    where the CPU has no FMA). Four accumulators, four blocks a turn, then the leftover blocks into
    the first; fixed sums at the end: the order depends only on the row's length."""
    block_of = {"bf16": BF16_BLOCK, "f32": F32_BLOCK}[kind]

    @intrinsic
    def dot(typingctx, w, x, out, j, r):
        if kind == "bf16" and not bf16_paths():
            return None  # a TypingError where this CPU lacks the instruction
        arrays = (w, x, out)
        if not all(isinstance(t, types.Array) and t.ndim == 2 and t.layout == "C" for t in arrays):
            return None
        signature = types.void(w, x, out, j, r)

        def codegen(context, builder, sig, args):
            parts = [context.make_array(t)(context, builder, v) for t, v in zip(sig.args[:3], args[:3], strict=True)]
            width = [cgutils.unpack_tuple(builder, part.shape)[1] for part in parts]
            row, col = (context.cast(builder, v, t, types.intp) for v, t in zip(args[3:], sig.args[3:], strict=True))
            wp = builder.gep(parts[0].data, [builder.mul(row, width[0])])
            xp = builder.gep(parts[1].data, [builder.mul(col, width[1])])
            f16x = _vector(_F32, 16)
            if kind == "bf16":
                pairs = _vector(_BFloat(), BF16_BLOCK)
                fn = _declare(builder.module, "llvm.x86.avx512bf16.dpbf16ps.512", f16x, [f16x, pairs, pairs])
                element = _I16
            else:
                fn = _declare(builder.module, "llvm.fmuladd.v16f32", f16x, [f16x] * 3)
                element = _F32
            zero = ir.Constant(f16x, [ir.Constant(_F32, 0.0)] * 16)
            accs = [cgutils.alloca_once_value(builder, zero) for _ in range(4)]
            # the same bytes of the next row, and ROW_AHEAD further on
            ahead = builder.add(width[0], ir.Constant(width[0].type, ROW_AHEAD * block_of // 64))

            def block(index, acc):
                at = _at(builder, index, block_of)
                line = builder.gep(wp, [builder.add(at, ahead)])
                _prefetch_at(builder, builder.bitcast(line, _I8.as_pointer()))
                wv, xv = (_load(builder, p, at, element, block_of) for p in (wp, xp))
                if kind == "bf16":
                    wv, xv = builder.bitcast(wv, pairs), builder.bitcast(xv, pairs)
                    builder.store(builder.call(fn, [builder.load(acc), xv, wv]), acc)
                else:
                    builder.store(builder.call(fn, [xv, wv, builder.load(acc)]), acc)

            blocks = builder.udiv(width[0], ir.Constant(width[0].type, block_of))
            quads = builder.udiv(blocks, ir.Constant(blocks.type, 4))
            with cgutils.for_range(builder, quads) as loop:
                for a in range(4):
                    block(builder.add(_at(builder, loop.index, 4), ir.Constant(blocks.type, a)), accs[a])
            with cgutils.for_range(builder, builder.sub(blocks, _at(builder, quads, 4)), intp=blocks.type) as loop:
                block(builder.add(_at(builder, quads, 4), loop.index), accs[0])
            a, b, c, d = (builder.load(acc) for acc in accs)
            acc = builder.fadd(builder.fadd(a, b), builder.fadd(c, d))
            total = _lane_sum(builder, acc, 16)
            builder.store(total, builder.gep(parts[2].data, [builder.add(builder.mul(col, width[2]), row)]))
            return context.get_dummy_value()

        return signature, codegen

    return dot


_bf16_dot, _f32_dot = _dot_row("bf16"), _dot_row("f32")


@parallel
def rows_bf16(x, w, out):
    """out (m, n) = x (m, k) times w (n, k), both bf16 bits (int16), k a multiple of BF16_BLOCK."""
    n = w.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        for j in range(c * CHUNK, min(n, c * CHUNK + CHUNK)):
            for r in range(x.shape[0]):
                _bf16_dot(w, x, out, j, r)


@serial
def rows_bf16_serial(x, w, out):
    for j in range(w.shape[0]):
        for r in range(x.shape[0]):
            _bf16_dot(w, x, out, j, r)
