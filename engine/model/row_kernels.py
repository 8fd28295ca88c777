"""Decoded rows (a token alone, or with its prompt-lookup draft) through numba-compiled kernels that
stream the weights at memory speed; prompts through torch's GEMM as before.

Why: a decode step is a one-row matrix product per linear, so it can go no faster than the
weights stream from memory. torch 2.14's one-row products reach about half of that (issue #30:
47-58% on the CPUs measured); a plain numba loop over the output rows, split across threads,
reached 0.73-0.88 (numba_rows.py has the kernels). numba compiles at run time with no compiler on
the user's machine; the compiled code is cached on disk in the data folder (the install folder
may be read-only), so only the first launch compiles.

Where numba is missing, does not import or does not compile, torch's kernels run and one line
says so; whether it is faster on this CPU is measured by calibrate.py, which records the answer
(FormatSpeed.rows). Threads: as many as torch uses, through numba's TBB layer where Intel's TBB
loads (the `tbb` package: Linux and Windows on x86-64), else its `workqueue` layer. A call handed
to two threads cost 2 us through TBB, whose workers wait for the next call spinning briefly, and
86 us through workqueue, whose workers sleep (2-core AMD EPYC VM, Zen 4): a decode step makes
about 90 such calls, and the int4 model's kernels streamed 29-30 GB/s against 21. numba's OpenMP
layer is never taken: it runs a second OpenMP runtime beside torch's, and the two spun against
each other on a 2-core EPYC (a stream of fp32 one-row products 2.8 GB/s against 6.7 with
workqueue, torch's ops between the calls); torch's own spinning is cut short for the same reason
(engine/__init__.py). workqueue must not be entered from two threads at once (numba
aborts the process), hence the lock.

Exactness: a kernel's row does not depend on the other rows it came with (each dot product is
one loop whose order depends only on its length), so a token and its draft agree; prompt chunks
(PROMPT_ROWS rows and more) never take these kernels. Products differ from torch's in the last
bits, so the KV namespace names the kernel (weights.WeightPlan.fingerprint_part).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import NamedTuple, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..device.process_memory import private_bytes
from . import packed_linear
from .prompt_rows import PROMPT_ROWS

log = logging.getLogger(__name__)

# named in the KV store namespace (layout()): change it when a kernel's arithmetic changes
# (v2: an int4 prompt chunk's product runs in bf16 in a bf16 model, an fp32 one through oneDNN;
# v3: int8, bf16 and fp16 rows sum in spans, numba_rows.SPAN_BYTES; v4: fp32 rows in blocks of 16,
# numba_rows._dot_row)
LAYOUT = "numba-rows-v4"
CACHE_FOLDER = "numba-cache"  # under the data folder

# weights smaller than this go through the serial kernels on the calling thread: handing a call to
# numba's workqueue threads cost 60-80 us on the 2-core EPYC, what one thread takes for 1536 x 256
# fp32 weights (33 us); through TBB (2 us) 256 KB decoded the int4 model no faster (2-core EPYC VM,
# 20.3-23.4 tok/s against 22.4-25.3); a weight's kernel never depends on how many rows come, so
# rows stay independent
SERIAL_BYTES = 2 << 20
_lock = threading.Lock()
_loading = threading.Lock()
_threads = threading.local()  # the thread count numba was last given on this thread (numba's is per thread)
_state: dict[str, object] = {}  # "kernels": the compiled module, or "why": why there is none; "bytes"


def version() -> str:
    try:
        return importlib.metadata.version("numba")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def prepare(data_dir: Path | str | None) -> None:
    """Start load() on a thread of its own, so importing numba and reading its cache overlap the
    model's load (0.4-0.5 s on the 2-core EPYC, most of it numba's import); load() joins it.
    Called after the processor's load, whose memory is measured the same way (memory_bytes)."""
    if "kernels" not in _state and "why" not in _state and not _loading.locked():
        threading.Thread(target=load, args=(data_dir,), name="numba-kernels", daemon=True).start()


def load(data_dir: Path | str | None) -> ModuleType | None:
    """The compiled kernels (numba_rows), compiled or read from the cache in `data_dir` once per
    process; None, with one logged line saying why, where numba cannot serve. The compile (or
    cache read) time is logged: it is part of the model's startup."""
    with _loading:
        return _load(data_dir)


def _load(data_dir: Path | str | None) -> ModuleType | None:
    if "kernels" in _state or "why" in _state:
        return _state.get("kernels")  # type: ignore[return-value]
    t0 = time.perf_counter()
    before = private_bytes()
    try:
        if data_dir is not None and "NUMBA_CACHE_DIR" not in os.environ:
            folder = Path(data_dir) / CACHE_FOLDER
            folder.mkdir(parents=True, exist_ok=True)
            os.environ["NUMBA_CACHE_DIR"] = str(folder)  # read by numba's config when it is imported
            import numba

            numba.config.CACHE_DIR = str(folder)  # type: ignore[attr-defined]  # and where numba was imported before
        import numba

        _load_tbb()
        numba.config.THREADING_LAYER = "default"  # type: ignore[attr-defined]  # the first of these that loads:
        numba.config.THREADING_LAYER_PRIORITY = ["tbb", "workqueue", "omp"]  # type: ignore[attr-defined]
        from . import numba_rows

        _warm_up(numba_rows)
    except Exception as exc:  # ImportError, numba's compile errors, an unwritable cache: torch serves
        _state["why"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        log.warning("one-row kernels: numba unavailable (%s); torch's kernels run", _state["why"])
        return None
    _state["kernels"] = numba_rows
    _state["bytes"] = max(0, private_bytes() - before)
    log.info(
        "one-row kernels: numba %s ready in %.2f s, %.0f MiB (threads: %s; cache %s)",
        version(),
        time.perf_counter() - t0,
        memory_bytes() / 2**20,
        threading_layer(),
        os.environ.get("NUMBA_CACHE_DIR", "next to the code"),
    )
    return numba_rows


TBB_LIBRARY = {"linux": "libtbb.so.12", "win32": "tbb12.dll", "darwin": "libtbb.12.dylib"}


def _load_tbb() -> None:
    """Load Intel TBB's library from the `tbb` package, so that numba's TBB layer finds it: pip
    puts it in the environment's own lib folder, where the system's loader does not look. Nothing
    where the package is absent (numba then takes workqueue)."""
    import ctypes
    import sys

    name = TBB_LIBRARY.get(sys.platform)
    try:
        files = importlib.metadata.files("tbb") or []
    except importlib.metadata.PackageNotFoundError:
        return
    for f in files:
        if f.name == name:
            path = Path(str(f.locate())).resolve()
            if path.is_file():
                try:
                    ctypes.CDLL(str(path), mode=getattr(ctypes, "RTLD_GLOBAL", 0))
                except OSError as exc:
                    log.info("one-row kernels: TBB not loaded (%s); numba's workqueue threads serve", exc)
                return


def threading_layer() -> str:
    """numba's threading layer in this process ("tbb" or "workqueue"), or "none" before the first
    parallel call."""
    try:
        import numba

        return str(numba.threading_layer())  # type: ignore[attr-defined]
    except (ImportError, ValueError):
        return "none"


def int4_path() -> str:
    """The int4 kernel this process runs: the fastest of numba_rows.Q4_PATHS this CPU has (its
    integer dot instructions), or "generic" (numba_rows.rows_int4) where it has none."""
    if "int4" not in _state:
        from . import numba_rows

        _state["int4"] = (numba_rows.q4_paths() or ["generic"])[0]
    return str(_state["int4"])


def int8_path() -> str:
    """How this process's int8 weights take decoded rows: through the CPU's integer dot
    instructions (numba_rows.Q8_PATHS, the int4 kernels' paths), activations as int8 per block of
    32 (llama.cpp's q8_0 x q8_0), or "fp32" (numba_rows.rows_int8: fp32 activations) where it has
    none. Measured on a 2-core AMD EPYC (Zen 4): 2-3x rows_int8's weights a second on one core in
    cache, for its own CPU and compiled for haswell; as fast or faster streamed from memory; a
    decode step of Qwen2-VL-2B's int8 model, 512-token prompt, 6 interleaved rounds: 51.8 ms
    against 57.7 (numbers in numba_rows)."""
    if "int8" not in _state:
        from . import numba_rows

        _state["int8"] = (numba_rows.q4_paths() or ["fp32"])[0]
    return str(_state["int8"])


def bf16_path() -> str:
    """How this process's bf16 weights take decoded rows: by the CPU's bf16 pair dot products
    (numba_rows.BF16_PATHS: rows_bf16, the rows rounded to bf16 first) or "fp32" (rows_half: each
    weight turned into fp32). Measured on a 2-core AMD EPYC (Zen 4), Qwen2-VL-2B's linears
    streamed from memory: 71.6 GB/s against 56.5 (numbers in numba_rows)."""
    if "bf16" not in _state:
        from . import numba_rows

        _state["bf16"] = (numba_rows.bf16_paths() or ["fp32"])[0]
    return str(_state["bf16"])


def layout() -> str:
    """The kernels' arithmetic, for the KV store namespace: LAYOUT and the int4, int8 and bf16 paths."""
    if "kernels" not in _state:
        return f"{LAYOUT};int4=none;int8=none;bf16=none"
    return f"{LAYOUT};int4={int4_path()};int8={int8_path()};bf16={bf16_path()}"


def memory_bytes() -> int:
    """Private memory that loading the kernels added to this process: numba, LLVM and the compiled
    code, kept for the process's life (0 before). Measured around load() like the processor's
    (engine/device/process_memory.py): close, not exact, where another thread allocated meanwhile.
    2-core EPYC VM: about 100 MiB on the launch that compiles, 40 MiB reading the cache."""
    return int(_state.get("bytes", 0))  # type: ignore[call-overload]


def unavailable() -> str:
    """Why the kernels are not loaded ("" when they are, or were never asked for)."""
    return str(_state.get("why", ""))


class KernelWeight(NamedTuple):
    """A full-precision weight as its one-row kernel reads it."""

    name: str  # the kernel (numba_rows), parallel; kernel() picks the serial one for small weights
    bits: np.ndarray  # fp32 as it is, bf16 as its bits in int16, fp16 as its bits in uint16
    takes: torch.dtype  # the dtype of the rows of input the kernel multiplies (rows_input)


def kernel_weight(w: torch.Tensor) -> KernelWeight:
    """The kernel for a full-precision weight and the weight as it reads it: fp32 rows_f32; bf16
    rows_bf16 on bf16 rows where the CPU has the instruction (bf16_path) and the width allows,
    else rows_half, as fp16 (numba_rows._to_f32 tells the two half-width formats apart by type)."""
    if w.dtype == torch.float32:
        return KernelWeight("rows_f32", w.numpy(), torch.float32)
    bits = w.view(torch.int16).numpy()
    if w.dtype != torch.bfloat16:
        return KernelWeight("rows_half", bits.view(np.uint16), torch.float32)
    from . import numba_rows

    if bf16_path() != "fp32" and w.shape[1] % numba_rows.BF16_BLOCK == 0:
        return KernelWeight("rows_bf16", bits, torch.bfloat16)
    return KernelWeight("rows_half", bits, torch.float32)


def rows_input(flat: torch.Tensor, takes: torch.dtype) -> np.ndarray:
    """Decoded rows as a kernel taking `takes` reads them: fp32 values, or bf16 bits in int16."""
    x = flat.detach().to(takes).contiguous()
    return x.view(torch.int16).numpy() if takes == torch.bfloat16 else x.numpy()


def _warm_up(k: ModuleType) -> None:
    """Compile (or load from the cache) every kernel this CPU runs, parallel and serial, for the
    argument types Parley passes, and check each on a small product against numpy: a kernel that
    computes wrong on this CPU is no kernel. Where a dot path serves bf16 or int8, the kernels
    that serve rows of other widths (rows_half on bf16 bits, rows_int8: no real model's widths)
    compile on their first call instead: each parallel kernel takes about a second to compile
    (2-core AMD EPYC, Zen 4), and the first launch's compile should stay under 10 s."""
    g = np.random.default_rng(0)
    x = g.standard_normal((2, 64), dtype=np.float32)
    w = g.standard_normal((8, 64), dtype=np.float32)
    checks: list[tuple[np.ndarray, np.ndarray]] = []
    paths = [int4_path()]  # the generic int4 kernel compiles only where it runs
    for suffix in ("", "_serial"):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            weight = torch.from_numpy(w).to(dtype)
            out = np.empty((2, 8), np.float32)
            name, bits, takes = kernel_weight(weight)
            _call(getattr(k, name + suffix), rows_input(torch.from_numpy(x), takes), bits, out)
            seen = torch.from_numpy(x).to(takes).double().numpy()
            checks.append((out, seen @ weight.double().numpy().T))
        for path in paths:
            q = Int4Weights.of(torch.from_numpy(w), path)
            out = np.empty((2, 8), np.float32)
            q.rows(torch.from_numpy(x), out, k, serial=bool(suffix))
            checks.append((out, _int4_reference(torch.from_numpy(x), q).numpy()))
    w8 = np.clip(np.round(w * 40), -127, 127).astype(np.int8)
    seen = fake_quantized_activations(torch.from_numpy(x)).numpy() if int8_path() != "fp32" else x
    for serial in (False, True):
        out = np.empty((2, 8), np.float32)
        int8_products(x, w8, np.full(8, 0.5, np.float32), out, k, serial)
        checks.append((out, seen.astype(np.float64) @ w8.T * 0.5))
    for path in paths:
        q = Int4Weights.of(torch.from_numpy(w), path)
        prompt = Int4Linear(q, None, k)._prompt_product(torch.from_numpy(x), q)
        checks.append((prompt.numpy(), _int4_reference(torch.from_numpy(x), q).numpy()))
    for got, want in checks:
        if not np.allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max()):
            raise ArithmeticError("a compiled one-row kernel disagrees with numpy on this CPU")


def kernel(kernels: ModuleType, name: str, weight_bytes: int, serial: bool | None = None):
    """The kernel `name` for a weight of this many bytes: serial when small (SERIAL_BYTES)."""
    serial = weight_bytes < SERIAL_BYTES if serial is None else serial
    return getattr(kernels, name + ("_serial" if serial else ""))


def _call(fn, *args) -> None:
    """One kernel call on the caller's thread count (numba's is per calling thread), never two at once."""
    threads = torch.get_num_threads()
    with _lock:
        if _threads.__dict__.get("n") != threads:
            import numba

            numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
            _threads.n = threads
        fn(*args)


class SharedRows(Protocol):
    """The group a linear decodes in with its siblings (shared_input.SharedInput): its products
    of the decoded rows `x` (fp32), or None when it computes them alone."""

    def rows(self, member: nn.Module, x: torch.Tensor) -> torch.Tensor | None: ...


def rows_served(x: torch.Tensor) -> bool:
    """Whether these flattened rows are decoded ones (fewer than PROMPT_ROWS) on the CPU."""
    return len(x) < PROMPT_ROWS and x.device.type == "cpu"


# A bf16 or fp16 model's prompt chunks are computed in fp32 where that timed at least this many
# times faster than torch's product in the weights' own dtype. Measured, Qwen2-VL-2B's widths, 2
# cores: 5x on an AMD EPYC without bf16 units (AVX2 only); bf16 faster where it has them (Zen 4,
# AVX512-BF16). The margin keeps a CPU near a tie on torch's own path from one process to the
# next, since the choice is in the KV store namespace (a flip would strand spilled KV).
HALF_PROMPT_MARGIN = 1.5
# fp32 weight rows held at once for a prompt chunk: half_product_in_fp32's and int4's dequantized ones
PROMPT_SLICE_BYTES = 32 << 20
_half_prompts: dict[torch.dtype, str] = {}  # half_prompt_path's answers, under _half_prompts_lock
_half_prompts_lock = threading.Lock()  # the thread loading a model (its plan) and the one running it


def half_prompt_path(dtype: torch.dtype) -> str:
    """How this process multiplies a prompt chunk by bf16 or fp16 weights: "fp32" (the chunk and
    the weights a slice at a time turned into fp32, the products rounded back) or "own" (torch's
    product in `dtype`). Timed once per process and dtype (0.4 s on the AVX2-only EPYC): a 2048 x
    1536 weight times PROMPT_TIMING_ROWS rows, best of three after a warm-up, where the fp32 path
    must win by HALF_PROMPT_MARGIN. It serves the language model's prompt chunks (RowLinear) and
    the vision tower (Fp32ProductLinear), which in bf16 encoded a 448 x 336 picture 6.6x slower
    than in fp32 on that CPU, 1.4x with its linears through this path."""
    with _half_prompts_lock:  # one timing per process: two answers would split the KV namespace
        if dtype not in _half_prompts:
            _half_prompts[dtype] = "fp32" if _fp32_faster(dtype) else "own"
        return _half_prompts[dtype]


PROMPT_TIMING_ROWS = 256


def _fp32_faster(dtype: torch.dtype) -> bool:
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(2048, 1536, generator=g) * 0.02).to(dtype)
    x = torch.randn(PROMPT_TIMING_ROWS, 1536, generator=g).to(dtype)

    def seconds(run) -> float:
        t = time.perf_counter()
        run()
        return time.perf_counter() - t

    own, fp32 = lambda: F.linear(x, w), lambda: half_product_in_fp32(x, w, None)  # noqa: E731
    with torch.inference_mode():
        best_own, best_fp32 = seconds(own), seconds(fp32)  # warm-ups
        for _ in range(3):
            best_own, best_fp32 = min(best_own, seconds(own)), min(best_fp32, seconds(fp32))
    return best_fp32 * HALF_PROMPT_MARGIN <= best_own


def half_product_in_fp32(flat: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """flat @ weight.T + bias for a bf16/fp16 prompt chunk, computed in fp32: the weight turned
    into fp32 a slice of output rows at a time (PROMPT_SLICE_BYTES, so an output head never
    exists in fp32 whole), the sums rounded to flat's dtype once, with the bias added."""
    x = flat.float()
    step = max(1, PROMPT_SLICE_BYTES // (4 * flat.shape[1]))
    out = flat.new_empty(len(flat), weight.shape[0])
    for a in range(0, weight.shape[0], step):
        b = min(weight.shape[0], a + step)
        out[:, a:b] = F.linear(x, weight[a:b].float(), None if bias is None else bias[a:b].float())
    return out


class Fp32ProductLinear(nn.Linear):
    """A bf16 or fp16 nn.Linear whose products are computed in fp32 (half_product_in_fp32): the
    vision tower's, where this CPU runs that faster (half_prompt_path). It never decodes one row
    at a time, so no product is small enough for the weight's turning into fp32 to dominate."""

    @classmethod
    def of(cls, linear: nn.Linear) -> Fp32ProductLinear:
        new = cls(linear.in_features, linear.out_features, linear.bias is not None, "meta", linear.weight.dtype)
        new.weight, new.bias = linear.weight, linear.bias  # the same parameters: residency swaps them
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        return half_product_in_fp32(flat, self.weight, self.bias).reshape(*x.shape[:-1], self.out_features)


def use_fp32_products(model: nn.Module, within: tuple[str, ...]) -> int:
    """Swap every bf16/fp16 nn.Linear under `within` (the vision encoder and projector) for an
    Fp32ProductLinear over the same parameters. Returns how many."""
    inside = tuple(p + "." for p in within)
    count = 0
    for name, module in list(model.named_modules()):
        if type(module) is nn.Linear and name.startswith(inside) and module.weight.dtype != torch.float32:
            _replace(model, name, Fp32ProductLinear.of(module))
            count += 1
    return count


class RowLinear(nn.Module):
    """A full-precision linear (fp32, bf16 or fp16 weights as loaded, row-major) whose decoded rows
    go through the numba kernel in fp32, and whose prompt chunks go through F.linear (fp32: oneDNN,
    PACKED_PROMPT_BYTES; bf16 and fp16: in fp32 where this CPU runs that faster, half_prompt_path)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kernels: ModuleType):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight, self.bias = weight, bias
        self.kernels = kernels  # numba_rows
        self._args: tuple = (None, None, None)  # (the weight's address, kernel, KernelWeight), made on first use
        self.shared_input: SharedRows | None = None  # set by join()

    @classmethod
    def of(cls, linear: nn.Linear, kernels: ModuleType) -> RowLinear:
        return cls(linear.weight, linear.bias, kernels)

    def _kernel_args(self) -> tuple:
        """(kernel, KernelWeight) for the weight as it is now (own_weights may move it after this
        module is made)."""
        w = self.weight.detach()
        if self._args[0] != w.data_ptr():
            found = kernel_weight(w)
            self._args = (w.data_ptr(), kernel(self.kernels, found.name, w.numel() * w.element_size()), found)
        return self._args[1], self._args[2]

    def join(self, group: SharedRows, weight: torch.Tensor) -> None:
        """Hold a row view of the stack `group` decodes over (shared_input.py): the same values."""
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.shared_input = group

    # fp32 weights up to this size go through oneDNN for a prompt chunk, reordered on each call:
    # F.linear (MKL) ran 512 x 1536 x 8960 in 151 ms on a 2-core AMD EPYC (Zen 4), the reorder
    # and oneDNN's product in 89 (reorder 24); larger ones (an output head) keep F.linear
    PACKED_PROMPT_BYTES = 64 << 20

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if not rows_served(flat) or not self.weight.is_contiguous():
            w = self.weight.detach()
            if (
                w.dtype == torch.float32
                and w.numel() * 4 <= self.PACKED_PROMPT_BYTES
                and packed_linear.available(w.dtype)
            ):
                return packed_linear.linear(x, packed_linear.pack_weight(w), self.bias)
            if w.dtype != torch.float32 and x.dtype == w.dtype and half_prompt_path(w.dtype) == "fp32":
                return half_product_in_fp32(flat, w, self.bias).reshape(*x.shape[:-1], self.out_features)
            return F.linear(x, self.weight, self.bias)
        rows = None if self.shared_input is None else self.shared_input.rows(self, x)
        if rows is None:
            out = np.empty((len(flat), self.out_features), np.float32)
            fn, w = self._kernel_args()
            _call(fn, rows_input(flat, w.takes), w.bits, out)
            rows = torch.from_numpy(out)
        y = rows.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.weight.dtype}, numba rows"


def int8_rows(flat: torch.Tensor, weight: torch.Tensor, scale32: torch.Tensor, kernels: ModuleType) -> torch.Tensor:
    """x @ (weight * scale).T for decoded rows: int8 weights (n, k), fp32 scales, fp32 result."""
    out = torch.empty(len(flat), weight.shape[0], dtype=torch.float32)
    x = flat.detach().to(torch.float32).contiguous().numpy()
    int8_products(x, weight.detach().numpy(), scale32.detach().numpy(), out.numpy(), kernels)
    return out


def int8_products(
    x: np.ndarray, w: np.ndarray, scale: np.ndarray, out: np.ndarray, kernels: ModuleType, serial: bool | None = None
) -> None:
    """out (m, n) fp32 = x (m, k) fp32 times int8 rows w (n, k) and their scales, through
    int8_path() where k is whole pairs of blocks (real models' widths are multiples of 64).
    `serial`: the one-thread kernel (by size unless given)."""
    path = int8_path()
    if path == "fp32" or x.shape[1] % (2 * BLOCK):
        _call(kernel(kernels, "rows_int8", w.size, serial), x, w, scale, out)
        return
    xq = np.empty(x.shape, np.int8)
    bias = np.empty((len(x), x.shape[1] // 4), np.int32)  # the int4 kernels' starts: not used here
    xd = np.empty((len(x), x.shape[1] // BLOCK), np.float32)
    kernels.quantize_q8_activations(x, xq, bias, xd)
    _call(kernel(kernels, "rows_q8_" + path, w.size, serial), xq, xd, w, scale, out)


# ------------------------------------------------------------------ 4-bit: llama.cpp Q4_0's bytes

BLOCK = 32  # weights per fp16 scale: 16 bytes of nibbles + 2 of scale, 18 bytes per 32 weights


SIDE_BY_SIDE = 256  # blocks of output rows the int4 kernel's vectorized loop runs over at least (numba_rows)


class Int4Weights:
    """One weight matrix in blocks of 32 along its input with one fp16 scale each (Q4_0): a
    weight is (nibble - 8) * scale, the nibble 0..15. Stored as its kernel streams it (`path`,
    int4_path()):

    - "generic" (numba_rows.rows_int4): `per` output rows side by side, nibbles (groups, 16,
      per * blocks), scales (groups, per, blocks) as fp16 bits; outputs padded to a multiple of
      `per` with zero rows.
    - an integer-dot path (numba_rows.Q4_PATHS, rows_q4_*): row by row in pairs of blocks, nibbles
      (out, pairs * 32) with block 2p in the low nibbles of pair p and block 2p + 1 in the high,
      scales (out, pairs * 2); per = 1.

    Inputs not a multiple of 32 (or, paired, 64) wide are padded with zeros."""

    def __init__(
        self, nibbles: torch.Tensor, scales: torch.Tensor, in_features: int, out_features: int, path: str | None = None
    ):
        self.nibbles, self.scales = nibbles, scales
        self.in_features, self.out_features = in_features, out_features
        if scales.dim() == 3:
            self.path = "generic"
            _, self.per, self.blocks = scales.shape
        else:
            self.path = path if path not in (None, "generic") else int4_path()
            self.per, self.blocks = 1, scales.shape[1]

    @classmethod
    def of(cls, weight: torch.Tensor, path: str | None = None) -> Int4Weights:
        """Quantized as llama.cpp's quantize_row_q4_0 does: the block's value of largest magnitude
        maps to nibble 0 (-8), the rest rounded to the nearest step. `path`: int4_path() unless given."""
        path = int4_path() if path is None else path
        out, k = weight.shape
        blocks = -(-k // BLOCK)
        if path != "generic":
            blocks += blocks % 2
        per = max(1, min(out, -(-SIDE_BY_SIDE // blocks))) if path == "generic" else 1
        groups = -(-out // per)
        w = torch.zeros(groups * per, blocks * BLOCK, dtype=torch.float32)
        w[:out, :k] = weight.detach().float()
        w = w.reshape(groups * per, blocks, BLOCK)
        extreme = w.gather(2, w.abs().argmax(2, keepdim=True)).squeeze(2)  # signed
        scale = (extreme / -8).to(torch.float16)
        inverse = torch.where(scale != 0, 1 / scale.float(), torch.zeros(()))
        q = (w * inverse[..., None] + 8.5).clamp(0, 15).to(torch.uint8)  # truncation: + 0.5 rounds
        if path != "generic":
            paired = q.reshape(out, blocks // 2, 2, BLOCK)
            nibbles = (paired[:, :, 0] | (paired[:, :, 1] << 4)).reshape(out, -1).contiguous()
            return cls(nibbles, scale.view(torch.int16).contiguous(), k, out, path)
        nibbles = q[:, :, :16] | (q[:, :, 16:] << 4)  # (rows, blocks, 16)
        nibbles = nibbles.reshape(groups, per * blocks, 16).transpose(1, 2).contiguous()
        return cls(nibbles, scale.view(torch.int16).reshape(groups, per, blocks).contiguous(), k, out)

    @property
    def nbytes(self) -> int:
        return self.nibbles.numel() + 2 * self.scales.numel()

    def dequantized(self, a: int = 0, b: int | None = None) -> torch.Tensor:
        """Rows a:b of the weight in fp32 (out, in)."""
        b = self.out_features if b is None else b
        if self.path != "generic":
            q = self.nibbles[a:b].reshape(b - a, -1, 1, BLOCK)
            values = torch.cat([q & 15, q >> 4], 2).reshape(b - a, self.blocks, BLOCK).to(torch.float32) - 8
            scales = self.scales[a:b].view(torch.float16).float()
            return (values * scales[..., None]).reshape(b - a, -1)[:, : self.in_features]
        g0, g1 = a // self.per, -(-b // self.per)
        q = self.nibbles[g0:g1].transpose(1, 2).reshape(-1, self.blocks, 16)  # (rows, blocks, 16)
        values = torch.cat([(q & 15), (q >> 4)], 2).to(torch.float32) - 8
        scales = self.scales[g0:g1].reshape(-1, self.blocks).view(torch.float16).float()
        w = (values * scales[..., None]).reshape(len(values), -1)
        first = a - g0 * self.per
        return w[first : first + b - a, : self.in_features]

    def rows(self, flat: torch.Tensor, out: np.ndarray, kernels: ModuleType, serial: bool | None = None) -> None:
        """out (rows, out_features) fp32 = the decoded rows' products, activations quantized to
        int8 per block of 32 (as llama.cpp's q8_0) and integer dot products per block.
        `serial`: the one-thread kernel (by size unless given)."""
        if self.path != "generic":
            x = flat.detach().to(torch.float32).contiguous().numpy()
            xq = np.empty((len(x), self.blocks * BLOCK), np.int8)
            bias = np.empty((len(x), self.blocks * 8), np.int32)
            xd = np.empty((len(x), self.blocks), np.float32)
            kernels.quantize_q8_activations(x, xq, bias, xd)
            fn = kernel(kernels, "rows_q4_" + self.path, self.nbytes, serial)
            _call(fn, xq, bias, xd, self.nibbles.numpy(), self.scales.numpy(), out)
            return
        lo, hi, xd = quantized_activations(flat, self.blocks, self.per, kernels)
        padded = (
            out
            if self.out_features % self.per == 0
            else np.empty((len(flat), len(self.nibbles) * self.per), np.float32)
        )
        fn = kernel(kernels, "rows_int4", self.nbytes, serial)
        _call(fn, lo, hi, xd, self.nibbles.numpy(), self.scales.numpy(), padded)
        if padded is not out:
            out[:] = padded[:, : self.out_features]


def quantized_activations(
    flat: torch.Tensor, blocks: int, per: int, kernels: ModuleType
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of activations as int8 per block of 32 with an fp32 scale (amax / 127), padded with
    zeros to `blocks`: (low halves, high halves) as int16 (rows, 16, per * blocks), repeated for
    the `per` weight rows side by side, and the scales (rows, blocks). In numba: the same in
    torch ops took 130 us a call on the 2-core EPYC, a quarter of a 1536x1536 product."""
    x = flat.detach().to(torch.float32).contiguous().numpy()
    lo = np.empty((len(x), 16, per * blocks), np.int16)
    hi = np.empty_like(lo)
    xd = np.empty((len(x), blocks), np.float32)
    kernels.quantize_int4_activations(x, lo, hi, xd)
    return lo, hi, xd


def fake_quantized_activations(flat: torch.Tensor) -> torch.Tensor:
    """The rows as the int4 kernel sees them (int8 per block of 32 times the block's scale), in
    fp32: a prompt chunk computes with these, so it agrees with decoded rows up to rounding."""
    k = flat.shape[1]
    blocks = -(-k // BLOCK)
    x = torch.zeros(len(flat), blocks * BLOCK, dtype=torch.float32)
    x[:, :k] = flat
    x = x.reshape(len(flat), blocks, BLOCK)
    scale = x.abs().amax(2, keepdim=True) / 127
    inverse = torch.where(scale > 0, 1 / scale, torch.zeros(()))  # as numba_rows.quantize_int4_activations
    return ((x * inverse).round() * scale).reshape(len(flat), -1)[:, :k]


def _int4_reference(flat: torch.Tensor, w: Int4Weights) -> torch.Tensor:
    return (fake_quantized_activations(flat).double() @ w.dequantized().double().T).float()


def gemm_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype an int4 prompt chunk's dense product runs in: bf16 in a bf16 model, else fp32.
    bf16 products ran 4.8x fp32's on a 2-core AMD EPYC with AVX512-BF16 (512 x 1536 x 8960: 16 ms
    against 76; int4 prefill 61 tok/s with fp32 products); where a CPU has no bf16 units the
    calibration times the model in both dtypes and keeps the faster (calibrate.py)."""
    return torch.bfloat16 if dtype == torch.bfloat16 else torch.float32


class Int4Linear(nn.Module):
    """y = x @ W.T + bias with W in Int4Weights. Decoded rows: the numba kernel on int8 blocks of
    activations. Prompt chunks: the same activations (fake_quantized_activations) times W
    dequantized a slice of output rows at a time, by the dense GEMM in gemm_dtype."""

    def __init__(self, weights: Int4Weights, bias: nn.Parameter | None, kernels: ModuleType):
        super().__init__()
        self.in_features, self.out_features = weights.in_features, weights.out_features
        # buffers, so the memory ledger counts them (and .to() would move them)
        self.register_buffer("nibbles", weights.nibbles, persistent=False)
        self.register_buffer("scales", weights.scales, persistent=False)
        self.bias = bias
        self.kernels = kernels  # numba_rows
        self.path = weights.path
        self.shared_input: SharedRows | None = None  # set by join()

    nibbles: torch.Tensor
    scales: torch.Tensor

    @property
    def weights(self) -> Int4Weights:
        return Int4Weights(self.nibbles, self.scales, self.in_features, self.out_features, self.path)

    def join(self, group: SharedRows, nibbles: torch.Tensor, scales: torch.Tensor) -> None:
        """Hold row views of the stack `group` decodes over (shared_input.py; row-by-row layouts
        only): the same values."""
        self.nibbles, self.scales, self.shared_input = nibbles, scales, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).detach()
        w = self.weights
        if rows_served(flat):
            shared = None if self.shared_input is None else self.shared_input.rows(self, x)
            if shared is None:
                shared = torch.empty(len(flat), self.out_features, dtype=torch.float32)
                w.rows(flat.float(), shared.numpy(), self.kernels)
            out = shared
        else:
            out = self._prompt_product(flat, w)
        y = out.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def _prompt_product(self, flat: torch.Tensor, w: Int4Weights) -> torch.Tensor:
        """The chunk's int8-per-block activations (as decoded rows see them) times the weights
        turned back into fp32 by numba a few groups of rows at a time (PROMPT_SLICE_BYTES), both in
        the order the weights are stored (numba_rows.dequantize_int4, dequantize_q4), by the dense
        GEMM in the model's dtype (gemm_dtype)."""
        if w.path != "generic":
            return self._paired_prompt_product(flat, w)
        flat = flat.float()
        xq = torch.zeros(len(flat), w.blocks * BLOCK, dtype=torch.float32)
        xq[:, : self.in_features] = fake_quantized_activations(flat)
        xq = xq.reshape(len(flat), w.blocks, 2, 16).permute(0, 2, 3, 1).reshape(len(flat), -1).contiguous()
        groups = len(w.nibbles)
        step = max(1, PROMPT_SLICE_BYTES // (4 * BLOCK * w.blocks * w.per))  # groups at a time
        out = torch.empty(len(flat), groups * w.per, dtype=torch.float32)
        buffer = np.empty((min(step, groups) * w.per, 2, 16, w.blocks), np.float32)
        nibbles, scales = w.nibbles.numpy(), w.scales.numpy()
        for g in range(0, groups, step):
            n = min(step, groups - g)
            part = buffer[: n * w.per]
            _call(self.kernels.dequantize_int4, nibbles, scales, g, part)
            torch.mm(xq, torch.from_numpy(part).reshape(len(part), -1).T, out=out[:, g * w.per : (g + n) * w.per])
        return out[:, : self.out_features]

    def _paired_prompt_product(self, flat: torch.Tensor, w: Int4Weights) -> torch.Tensor:
        dtype = gemm_dtype(flat.dtype)
        xq = torch.zeros(len(flat), w.blocks * BLOCK, dtype=torch.float32)
        xq[:, : self.in_features] = fake_quantized_activations(flat.float())
        xq = xq.to(dtype)
        step = max(1, PROMPT_SLICE_BYTES // (4 * BLOCK * w.blocks))  # rows at a time
        out = torch.empty(len(flat), self.out_features, dtype=dtype)
        buffer = np.empty((min(step, self.out_features), w.blocks * BLOCK), np.float32)
        cast = torch.empty(buffer.shape, dtype=dtype) if dtype != torch.float32 else torch.from_numpy(buffer)
        nibbles, scales = w.nibbles.numpy(), w.scales.numpy()
        for j in range(0, self.out_features, step):
            n = min(step, self.out_features - j)
            _call(self.kernels.dequantize_q4, nibbles, scales, j, buffer[:n])
            if dtype != torch.float32:
                cast[:n].copy_(torch.from_numpy(buffer[:n]))
            torch.mm(xq, cast[:n].T, out=out[:, j : j + n])
        return out

    def extra_repr(self) -> str:
        shape = f"in_features={self.in_features}, out_features={self.out_features}"
        return f"{shape}, int4 (Q4_0 blocks), numba rows ({self.path})"


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, new)


def use_rows(model: nn.Module, skip: tuple[str, ...], kernels: ModuleType) -> int:
    """Swap every plain full-precision nn.Linear outside `skip` (the vision encoder and projector)
    for a RowLinear over the same weight (no copy; a tied output head keeps sharing the token
    embedding's table). Returns how many."""
    outside = tuple(p + "." for p in skip)
    count = 0
    for name, module in list(model.named_modules()):
        if type(module) is nn.Linear and not name.startswith(outside) and module.weight.device.type == "cpu":
            _replace(model, name, RowLinear.of(module, kernels))
            count += 1
    return count


def pack_int4(model: nn.Module, skip: tuple[str, ...], kernels: ModuleType) -> int:
    """Quantize every language-model linear outside `skip` to Int4Linear, one at a time (the
    full-precision weight let go before the next), except the output head. Returns how many."""
    outside = tuple(p + "." for p in skip)
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    count = 0
    for name, module in list(model.named_modules()):
        if type(module) is nn.Linear and module is not head and not name.startswith(outside):
            _replace(model, name, Int4Linear(Int4Weights.of(module.weight), module.bias, kernels))
            count += 1
    return count
