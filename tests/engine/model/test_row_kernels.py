"""numba's one-row kernels (engine/model/row_kernels.py): each computes its own format's weights
(against float64 arithmetic), a row computes the same alone and inside a draft, prompt chunks
never take them, int4 is llama.cpp Q4_0's bytes and rounding, the compiled code is cached in the
data folder, and where numba cannot run, torch's kernels do and one line says so."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from engine.model import row_kernels
from engine.model.int8_layers import Int8Linear, int8_gemm_used
from engine.model.prompt_rows import PROMPT_ROWS
from engine.model.row_kernels import Int4Linear, Int4Weights, RowLinear

ROOT = Path(__file__).resolve().parents[3]
# int4 once per kernel path (int4_path() picks one per CPU); a path this CPU lacks is skipped
INT4 = ("int4:generic", "int4:vnni512", "int4:vnni256", "int4:avx2")
# int8 the same way (int8_path(): fp32 activations or the int-dot paths on int8 blocks of them)
INT8 = ("int8:fp32", "int8:vnni512", "int8:vnni256", "int8:avx2")
# bf16 too (bf16_path(): the weights turned into fp32, or the CPU's bf16 pair dot products)
BF16 = ("bf16:fp32", "bf16:avx512bf16")
FORMATS = ("fp32", *BF16, "fp16", *INT8, *INT4)


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    k = row_kernels.load(tmp_path_factory.mktemp("data"))
    assert k is not None, row_kernels.unavailable()
    return k


@pytest.fixture(autouse=True)
def format_path(request, monkeypatch):
    """An int8 or bf16 format's path for the whole test ("int8:avx2" runs the AVX2 path on this CPU)."""
    fmt = request.node.callspec.params.get("fmt", "") if hasattr(request.node, "callspec") else ""
    if fmt.startswith(("int8:", "bf16:")):
        monkeypatch.setattr(row_kernels, fmt.partition(":")[0] + "_path", lambda: fmt.partition(":")[2])


def _runs(fmt: str, kernels) -> None:
    path = fmt.partition(":")[2]
    if path not in ("", "generic", "fp32") and path not in kernels.q4_paths() + kernels.bf16_paths():
        pytest.skip(f"this CPU has no {path} instructions")


def _q4_0_reference(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's quantize_row_q4_0_ref, transcribed: per block of 32 the value of largest
    magnitude `max`, d = max / -8, q = min(15, int(x / d + 8.5)); returns (q (n, k), d (n, k/32))."""
    n, k = w.shape
    q = np.zeros((n, k), np.int64)
    d = np.zeros((n, k // 32), np.float32)
    for r in range(n):
        for b in range(k // 32):
            block = w[r, b * 32 : b * 32 + 32].astype(np.float32)
            amax = 0.0
            mx = 0.0
            for v in block:
                if abs(v) > amax:
                    amax, mx = abs(v), v
            dd = np.float32(mx / -8)
            inv = np.float32(1 / dd) if dd else np.float32(0)
            d[r, b] = np.float16(dd)
            q[r, b * 32 : b * 32 + 32] = np.minimum(15, (block * inv + np.float32(8.5)).astype(np.int8))
    return q, d


def _module(fmt: str, weight: torch.Tensor, bias: torch.Tensor | None, k) -> nn.Module:
    frozen = lambda t: nn.Parameter(t, requires_grad=False)  # noqa: E731
    b = None if bias is None else frozen(bias)
    if fmt.partition(":")[0] in ("fp32", "bf16", "fp16"):
        _runs(fmt, k)
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[fmt.partition(":")[0]]
        return RowLinear(frozen(weight.to(dtype)), b, k)
    if fmt.startswith("int8"):
        _runs(fmt, k)
        scale = weight.abs().amax(1) / 127
        q = (weight / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
        return Int8Linear(frozen(q), frozen(scale), b, None, k)
    _runs(fmt, k)
    return Int4Linear(Int4Weights.of(weight, fmt.partition(":")[2] or None), b, k)


def _q4_values(q: Int4Weights) -> torch.Tensor:
    """The weights in float64 (out, in), read from either layout's bytes."""
    if q.path == "generic":  # `per` output rows side by side
        nib = q.nibbles.transpose(1, 2).reshape(-1, q.blocks, 16)[: q.out_features].long()
        values = torch.cat([nib & 15, nib >> 4], 2).double() - 8
    else:  # row by row, pairs of blocks in the low and high nibbles
        nib = q.nibbles.reshape(q.out_features, -1, 1, 32).long()
        values = torch.cat([nib & 15, nib >> 4], 2).reshape(q.out_features, q.blocks, 32).double() - 8
    scales = q.scales.reshape(-1, q.blocks)[: q.out_features].view(torch.float16).double()
    return (values * scales[..., None]).reshape(q.out_features, -1)[:, : q.in_features]


def _reference(fmt: str, m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """float64 arithmetic on the module's own (rounded) weights; int4 on the int8 blocks of
    activations its kernel sees, bf16's dot path on the rows in bf16."""
    if isinstance(m, RowLinear):
        y = x.to(row_kernels.kernel_weight(m.weight.detach()).takes).double() @ m.weight.double().T
    elif isinstance(m, Int8Linear):
        if row_kernels.int8_path() != "fp32" and m.in_features % 64 == 0:  # int8 blocks of activations
            x = row_kernels.fake_quantized_activations(x.float())
        y = x.double() @ (m.weight.double() * m.scale.double()[:, None]).T
    else:
        assert isinstance(m, Int4Linear)
        blocks = x.double().reshape(len(x), -1, 32)
        scale = blocks.abs().amax(2, keepdim=True) / 127
        xq = (blocks / scale).round() * scale
        w = _q4_values(m.weights)
        y = xq.reshape(len(x), -1) @ w.T
    return y if m.bias is None else y + m.bias.double()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, PROMPT_ROWS - 1])
def test_each_kernel_computes_its_own_weights(fmt, rows, kernels):
    g = torch.Generator().manual_seed(rows)
    weight = torch.randn(300, 1536, generator=g) * 0.05
    m = _module(fmt, weight, torch.randn(300, generator=g), kernels)
    x = torch.randn(rows, 1536, generator=g)
    calls = []
    real = row_kernels._call
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(row_kernels, "_call", lambda fn, *a: (calls.append(fn), real(fn, *a)))
        with torch.inference_mode():
            y = m(x)
    assert len(calls) == 1  # the numba kernel computed it, not torch
    ref = _reference(fmt, m, x)
    assert y.dtype == torch.float32 and y.shape == (rows, 300)
    assert (y.double() - ref).abs().max() <= 1e-5 * ref.abs().max()


@pytest.mark.parametrize("fmt", FORMATS)
# 200: not a multiple of 32; 1100: rows of several spans (SPAN_BYTES); 1536: int8's int-dot paths
@pytest.mark.parametrize("width", [200, 1100, 1536])
def test_a_decoded_row_is_the_same_alone_or_with_its_draft(fmt, width, kernels):
    g = torch.Generator().manual_seed(7)
    m = _module(fmt, torch.randn(96, width, generator=g), None, kernels)
    x = torch.randn(PROMPT_ROWS - 1, width, generator=g)
    with torch.inference_mode():
        together = m(x)
        for i in range(len(x)):
            assert torch.equal(m(x[i : i + 1]), together[i : i + 1]), f"row {i}"


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_prompt_chunk_never_takes_a_row_kernel(fmt, kernels, monkeypatch):
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(64, 128, generator=g)
    m = _module(fmt, weight, None, kernels)
    dtype = getattr(m, "weight", torch.empty(0)).dtype if fmt.startswith(("bf16", "fp16")) else torch.float32
    chunk = torch.randn(PROMPT_ROWS, 128, generator=g).to(dtype)
    with torch.inference_mode():
        rows = m(chunk[:-1])

        real = row_kernels._call

        def refuse(fn, *a):
            if fn.py_func.__name__.startswith("rows_"):  # int4's prompt path dequantizes through numba
                raise AssertionError("a prompt chunk went through a one-row kernel")
            return real(fn, *a)

        monkeypatch.setattr(row_kernels, "_call", refuse)
        y = m(chunk)
    # the prompt path computes the same product (to its own rounding): int8's GEMM, where this CPU
    # takes it (int8_gemm_used: AVX512-VNNI ones), rounds each activation row to int8 as well
    exact = dtype == torch.float32 and not (
        fmt.startswith("int8") and (int8_gemm_used() or row_kernels.int8_path() != "fp32")
    )
    tol = 1e-5 if exact else 2e-2
    assert (y[:-1].double() - rows.double()).abs().max() <= tol * rows.double().abs().max()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("path", ["fp32", "own"])
def test_a_half_precision_prompt_chunk_computes_in_the_path_the_namespace_names(dtype, path, kernels, monkeypatch):
    """A bf16/fp16 model's prompt chunk through RowLinear: in fp32 (the weights turned into fp32
    a slice at a time, every sum rounded once) or through torch's own product, as
    half_prompt_path says; the plan's fingerprint (the KV store namespace) names which."""
    from engine.model.weights import plan_weights

    monkeypatch.setitem(row_kernels._half_prompts, dtype, path)
    monkeypatch.setattr(row_kernels, "PROMPT_SLICE_BYTES", 4 * 1100 * 40)  # 40 rows a slice: 8 slices
    g = torch.Generator().manual_seed(5)
    m = _module("fp16" if dtype == torch.float16 else "bf16", torch.randn(300, 1100, generator=g) * 0.05, None, kernels)
    m.bias = nn.Parameter(torch.randn(300, generator=g).to(dtype), requires_grad=False)
    chunk = torch.randn(2, PROMPT_ROWS, 1100, generator=g).to(dtype)
    with torch.inference_mode():
        y = m(chunk)
    assert y.dtype == dtype and y.shape == (2, PROMPT_ROWS, 300)
    exact = chunk.double() @ m.weight.double().T + m.bias.double()
    if path == "fp32":  # within fp32's sums of 1100 terms of what rounding the exact value gives
        assert (y.double() - exact.to(dtype).double()).abs().max() <= torch.finfo(dtype).eps * exact.abs().max()
    else:
        assert torch.equal(y, torch.nn.functional.linear(chunk, m.weight, m.bias))
    # the plan follows the same answer, and its fingerprint (the KV store namespace) says it
    plan = plan_weights(
        Path("."), "qwen2_vl", torch.device("cpu"), "auto", "bf16" if dtype == torch.bfloat16 else "fp16", 0
    )
    assert plan.fp32_products == (path == "fp32")
    assert plan.fingerprint_part().endswith(b";products=fp32") == (path == "fp32")
    assert not plan_weights(Path("."), "qwen2_vl", torch.device("cpu"), "auto", "fp32", 0).fp32_products


def test_the_half_precision_prompt_path_is_timed_once_per_process(monkeypatch):
    monkeypatch.setattr(row_kernels, "_half_prompts", {})
    timed = []
    monkeypatch.setattr(row_kernels, "_fp32_faster", lambda dtype: timed.append(dtype) or True)
    assert [row_kernels.half_prompt_path(torch.bfloat16) for _ in range(3)] == ["fp32"] * 3
    assert timed == [torch.bfloat16]


@pytest.mark.slow
@pytest.mark.parametrize("path", ["fp32", "own"])
def test_a_bf16_vision_tower_on_either_path_answers_a_picture_as_a_fresh_prefill(
    path, tiny_model, tmp_path, monkeypatch
):
    """A bf16 model's vision tower multiplies in fp32 where half_prompt_path says so (its linears
    Fp32ProductLinear over the same parameters, nothing else swapped): a picture turn equals a
    fresh full prefill's reply, before and after the encoder's weights were released and read
    back, and the two paths never share a KV namespace."""
    from engine.model.families import FAMILIES
    from engine.protocol.events import Message
    from tests.fixtures.pictures import make_picture, pics
    from tests.helpers.engine_helpers import Reference, ask, expect_done, open_engine, wait_report

    monkeypatch.setitem(row_kernels._half_prompts, torch.bfloat16, path)
    model_dir = tiny_model("qwen2_vl")
    ref = Reference(model_dir, dtype="bfloat16", weights="bf16")
    vision = tuple(p + "." for p in FAMILIES["qwen2_vl"].vision_modules)
    swapped = [n for n, m in ref.loaded.model.named_modules() if type(m) is row_kernels.Fp32ProductLinear]
    plain = [n for n, m in ref.loaded.model.named_modules() if type(m) is nn.Linear and n.startswith(vision)]
    assert all(n.startswith(vision) for n in swapped)
    assert (bool(swapped), bool(plain)) == ((True, False) if path == "fp32" else (False, True))
    engine = open_engine(model_dir, tmp_path / "d", dtype="bfloat16", weights="bf16", elastic_idle_s=3600)
    try:
        for i in (1, 2):  # the second after the encoder's weights were released and read back
            convo = [Message("user", "What is this?", pics(make_picture(tmp_path / f"{i}.png", i, size=(96, 72))))]
            done = expect_done(ask(engine, f"c{i}", convo, 6))
            assert done.stats.pictures_encoded == 1 and done.token_ids == ref.reply_ids(convo, 6)
            engine.unload_encoder()
            wait_report(engine, lambda r: r.encoder_state == "unloaded")
        assert done.stats.encoder_loads == 1
    finally:
        engine.shutdown()
    monkeypatch.setitem(row_kernels._half_prompts, torch.bfloat16, "own" if path == "fp32" else "fp32")
    assert Reference(model_dir, dtype="bfloat16", weights="bf16").loaded.fingerprint != ref.loaded.fingerprint


@pytest.mark.parametrize("path", ["generic", "avx2"])  # the two layouts (every int-dot path shares the second)
def test_int4_holds_q4_0s_bytes_and_rounding(path):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(6, 128, generator=g)
    w[0, :32] = 0  # an all-zero block: scale 0, every nibble 8
    q = Int4Weights.of(w, path)
    assert q.nbytes == 6 * 128 * 18 // 32  # 16 bytes of nibbles and a 2-byte scale per 32 weights
    want_q, want_d = _q4_0_reference(w.numpy())
    d = q.scales.reshape(-1, 4)[:6].view(torch.float16).double()
    got_q = (_q4_values(q) / d.repeat_interleave(32, 1) + 8).nan_to_num(8)  # nibbles back from the values
    assert np.array_equal(got_q.numpy(), want_q)
    assert np.array_equal(d.float().numpy(), want_d)


@pytest.mark.parametrize("fmt", INT4)
def test_int4_prompt_and_decoded_rows_compute_the_same_product(fmt, kernels):
    g = torch.Generator().manual_seed(2)
    m = _module(fmt, torch.randn(256, 1536, generator=g) * 0.05, None, kernels)
    x = torch.randn(PROMPT_ROWS + 4, 1536, generator=g)
    with torch.inference_mode():
        prompt = m(x)
        rows = torch.cat([m(x[i : i + 1]) for i in range(len(x))])
    assert (prompt - rows).abs().max() <= 1e-5 * rows.abs().max()


@pytest.mark.parametrize("fmt", [f for f in INT4 if f != "int4:generic"])  # generic: CPUs without bf16 units
def test_an_int4_prompt_chunk_of_a_bf16_model_multiplies_in_bf16(fmt, kernels):
    """A bf16 model's prompt chunk: the product runs in bf16 (several times fp32's speed on a CPU
    with bf16 units) and agrees with the fp32 model's product of the same rows to bf16's precision."""
    g = torch.Generator().manual_seed(4)
    m = _module(fmt, torch.randn(256, 1536, generator=g) * 0.05, None, kernels)
    x = torch.randn(PROMPT_ROWS + 4, 1536, generator=g).bfloat16()
    dtypes = []
    real = torch.mm
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "mm", lambda a, b, **kw: (dtypes.append((a.dtype, b.dtype)), real(a, b, **kw))[1])
        with torch.inference_mode():
            y16 = m(x)
    with torch.inference_mode():
        y32 = m(x.float())
    assert y16.dtype == torch.bfloat16 and set(dtypes) == {(torch.bfloat16, torch.bfloat16)}
    assert (y16.float() - y32).abs().max() <= 2e-2 * y32.abs().max()


def _run(code: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})}
    env.pop("NUMBA_CACHE_DIR", None)
    if "GOMP_SPINCOUNT" not in (env_extra or {}):
        env.pop("GOMP_SPINCOUNT", None)  # set in this process by importing the engine
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=300
    )


def _tbb_installed() -> bool:
    import importlib.metadata

    try:
        return any(f.name == row_kernels.TBB_LIBRARY["linux"] for f in importlib.metadata.files("tbb") or [])
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.mark.skipif(
    sys.platform != "linux" or not _tbb_installed(),
    reason="the tbb package (requirements.txt: Linux and Windows on x86-64) is not installed here",
)
@pytest.mark.parametrize(("tbb", "layer"), [(True, "tbb"), (False, "workqueue")])
def test_the_kernels_run_on_tbbs_threads_and_on_workqueues_without_it(kernels, tbb, layer):
    """With the tbb package numba's kernels run on TBB's threads; without it (its library is not
    on the loader's path) on numba's workqueue; the same sums either way. (The compiled kernels
    come from this process's cache folder: compiling afresh took 5-7 s a process.)"""
    data = Path(os.environ["NUMBA_CACHE_DIR"]).parent  # set by the `kernels` fixture's load
    code = f"""
        import importlib.metadata
        if not {tbb}:  # the package absent
            files = importlib.metadata.files
            def no_tbb(name):
                if name == "tbb":
                    raise importlib.metadata.PackageNotFoundError(name)
                return files(name)
            importlib.metadata.files = no_tbb
        import numpy as np
        from engine.model import row_kernels
        k = row_kernels.load({str(data)!r})
        x, w = np.ones((1, 64), np.float32), np.full((4096, 64), 0.5, np.float32)
        out = np.empty((1, 4096), np.float32)
        row_kernels._call(k.rows_f32, x, w, out)
        print(row_kernels.threading_layer(), float(out.sum()))
    """
    res = _run(code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [layer, str(4096 * 32.0)]


def test_without_numba_torch_serves_and_one_line_says_so(tmp_path, tiny_model):
    model = tiny_model("llava")
    code = f"""
        import logging, sys
        sys.modules["numba"] = None  # numba missing or failing to import
        logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
        from engine.model import row_kernels
        from engine.model.load import load_model, ModelLoadError
        assert row_kernels.load({str(tmp_path)!r}) is None
        try:
            load_model({str(model)!r}, weights="int4", speed_dir={str(tmp_path)!r})
        except ModelLoadError as exc:
            print("refused:", exc)
        loaded = load_model({str(model)!r}, weights="fp32", speed_dir={str(tmp_path)!r})
        print("fp32 loaded", loaded.weights)
    """
    res = _run(code)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert sum("numba unavailable" in line and "torch's kernels run" in line for line in lines) == 1
    assert any(line.startswith("refused: int4 weights need numba's kernels") for line in lines)
    assert "fp32 loaded fp32" in lines


def test_int4_decoded_rows_quantize_activations_exactly_as_prompts_do(kernels):
    """The same int8 values and scales on both paths (numba's loop and torch's ops): a decoded
    token's KV then differs from a prompt's only by the order of its additions."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(PROMPT_ROWS - 1, 1000, generator=g) * torch.logspace(-3, 2, 1000)  # 1000: not a multiple of 32
    blocks = -(-1000 // 32)
    lo, hi, xd = row_kernels.quantized_activations(x, blocks, 1, kernels)
    q = torch.cat([torch.from_numpy(lo).transpose(1, 2), torch.from_numpy(hi).transpose(1, 2)], 2)  # (m, blocks, 32)
    decoded = (q.float() * torch.from_numpy(xd)[..., None]).reshape(len(x), -1)[:, :1000]
    assert torch.equal(decoded, row_kernels.fake_quantized_activations(x))


def test_an_int8_layer_cast_with_its_model_to_bf16_still_decodes_through_numba(kernels):
    """An int4 model computing in bf16 casts the whole model after its int8 head is made: the
    decoded row must still go through the kernel with the fp32 scales (it failed with "unsupported
    ScalarType BFloat16")."""
    m = _module("int8", torch.randn(64, 128, generator=torch.Generator().manual_seed(5)), None, kernels)
    m.to(torch.bfloat16)
    x = torch.randn(1, 128, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    with torch.inference_mode():
        y = m(x)
    ref = _reference("int8", m, x.float())
    assert y.dtype == torch.bfloat16 and m.scale32.dtype == torch.float32
    assert (y.double() - ref).abs().max() <= 2e-2 * ref.abs().max()


@pytest.mark.parametrize("fmt", INT4)
def test_every_int4_path_sums_the_same_integers(fmt, kernels):
    """Weights and activations that are whole numbers with scale 1 (each block holds a -8 weight
    and a 127 activation): every product and sum is exact in fp32, so every path this CPU runs
    must equal float64 to the bit, whatever its order of additions; a row alone, inside a draft,
    on one thread or several."""
    g = torch.Generator().manual_seed(11)
    n, k = 200, 1568  # 49 blocks: the paired layout pads one
    w = torch.randint(-8, 8, (n, k), generator=g).float()
    w[:, ::32] = -8
    x = torch.randint(-127, 128, (PROMPT_ROWS - 1, k), generator=g).float()
    x[:, 5::32] = 127
    m = _module(fmt, w, None, kernels)
    assert m.scales.view(torch.float16).float().unique().tolist() in ([1.0], [0.0, 1.0])  # 0: padding
    want = (x.double() @ w.double().T).float()
    with torch.inference_mode():
        together = m(x)
        assert torch.equal(together, want)
        assert all(torch.equal(m(x[i : i + 1]), want[i : i + 1]) for i in range(len(x)))
    out = np.empty((len(x), n), np.float32)
    m.weights.rows(x, out, kernels, serial=True)
    assert np.array_equal(out, want.numpy())


def test_the_int_dot_paths_agree_to_the_bit_and_with_the_generic_kernel(kernels):
    """The 512- and 256-bit and AVX2 paths do the same arithmetic in the same order; the generic
    kernel rounds its per-block sums differently (fp32 per block, not per lane)."""
    paths = kernels.q4_paths()
    if not paths:
        pytest.skip("this CPU has no integer dot path")
    g = torch.Generator().manual_seed(12)
    w, x = torch.randn(300, 1000, generator=g) * 0.05, torch.randn(3, 1000, generator=g)
    outs = {}
    for path in ["generic", *paths]:
        out = np.empty((3, 300), np.float32)
        Int4Weights.of(w, path).rows(x, out, kernels)
        outs[path] = out
    for path in paths:
        assert np.array_equal(outs[path], outs[paths[0]]), path
    assert np.abs(outs[paths[0]] - outs["generic"]).max() <= 1e-5 * np.abs(outs["generic"]).max()


def test_the_int4_path_follows_the_cpus_instructions(kernels):
    avx2 = {"avx", "avx2", "fma", "f16c"}
    assert kernels.q4_paths(avx2) == ["avx2"]
    assert kernels.q4_paths(avx2 | {"avxvnni"}) == ["vnni256", "avx2"]  # e.g. Intel's Alder Lake
    assert kernels.q4_paths(avx2 | {"avx512f", "avx512bw", "avx512vl", "avx512vnni"}) == ["vnni512", "vnni256", "avx2"]
    assert kernels.q4_paths({"sse2", "avx"}) == [] and kernels.q4_paths({"neon"}) == []  # the generic kernel
    assert row_kernels.int4_path() == (kernels.q4_paths() or ["generic"])[0]
    assert row_kernels.int8_path() == (kernels.q4_paths() or ["fp32"])[0]
    # the KV namespace names both
    assert f"int4={row_kernels.int4_path()};int8={row_kernels.int8_path()}" in row_kernels.layout()


def test_the_bf16_path_follows_the_cpus_instructions(kernels):
    assert kernels.bf16_paths({"avx", "avx2", "fma", "f16c", "avx512f", "avx512vnni"}) == []  # no bf16 units
    assert kernels.bf16_paths({"avx2", "avx512f", "avx512bf16"}) == ["avx512bf16"]  # Zen 4, Cooper Lake on
    assert row_kernels.bf16_path() == (kernels.bf16_paths() or ["fp32"])[0]
    assert f"bf16={row_kernels.bf16_path()}" in row_kernels.layout()  # the KV namespace names it


@pytest.mark.parametrize("fmt", BF16)
def test_every_bf16_path_sums_the_same_exact_products(fmt, kernels):
    """Weights and activations with few significant bits, so that every product and sum is exact
    in fp32: both paths equal float64 to the bit, a row alone, inside a draft, on one thread or
    several; rows of other dtypes are rounded to bf16 first on the dot path (as the model's are)."""
    g = torch.Generator().manual_seed(17)
    n, k = 203, 1536
    w = torch.randint(-8, 9, (n, k), generator=g).to(torch.bfloat16)
    x = torch.randint(-8, 9, (PROMPT_ROWS - 1, k), generator=g).to(torch.bfloat16)
    m = _module(fmt, w.float(), None, kernels)
    want = (x.double() @ w.double().T).float()
    rounded = want.to(torch.bfloat16)  # a bf16 model's output
    with torch.inference_mode():
        assert torch.equal(m(x), rounded)
        assert all(torch.equal(m(x[i : i + 1]), rounded[i : i + 1]) for i in range(len(x)))
    found = row_kernels.kernel_weight(m.weight.detach())
    out = np.empty((len(x), n), np.float32)
    row_kernels._call(
        row_kernels.kernel(kernels, found.name, 0, serial=True), row_kernels.rows_input(x, found.takes), found.bits, out
    )
    assert np.array_equal(out, want.numpy())
    finer = x.float() * (1 + 2**-12)  # not bf16 values (but 0): the dot path rounds them back to x
    with torch.inference_mode():
        assert torch.equal(m(finer), want) == (fmt == "bf16:avx512bf16")


@pytest.mark.parametrize("fmt", INT8)
def test_every_int8_path_sums_the_same_integers(fmt, kernels):
    """Whole-number weights and activations, each block holding a 127 activation (its scale 1) and
    the extremes -128 and 127 among the weights: every product and sum is exact in fp32, so every
    path equals float64 to the bit; a row alone, inside a draft, on one thread or several."""
    g = torch.Generator().manual_seed(13)
    n, k = 203, 1536  # 203: rows past the last group of four
    w = torch.randint(-127, 128, (n, k), generator=g).to(torch.int8)
    w[:, 0], w[:, 1] = -128, 127
    x = torch.randint(-127, 128, (PROMPT_ROWS - 1, k), generator=g).float()
    x[:, 7::32] = 127
    m = _module(fmt, torch.zeros(n, k), None, kernels)
    m.weight.data, m.scale32 = w, torch.ones(n)
    want = (x.double() @ w.double().T).float()
    with torch.inference_mode():
        assert torch.equal(m(x), want)
        assert all(torch.equal(m(x[i : i + 1]), want[i : i + 1]) for i in range(len(x)))
    out = np.empty((len(x), n), np.float32)
    row_kernels.int8_products(x.numpy(), w.numpy(), np.ones(n, np.float32), out, kernels, serial=True)
    assert np.array_equal(out, want.numpy())


def test_the_int8_paths_agree_to_the_bit(kernels, monkeypatch):
    """Each int32 lane holds the same exact four products on every path, turned into fp32 and added
    in the same order: the 512- and 256-bit and AVX2 paths give the same bits on real values."""
    paths = kernels.q4_paths()
    if not paths:
        pytest.skip("this CPU has no integer dot path")
    g = torch.Generator().manual_seed(14)
    w = torch.randint(-127, 128, (300, 1536), generator=g).to(torch.int8).numpy()
    x, scale = torch.randn(3, 1536, generator=g).numpy(), (torch.rand(300, generator=g) / 127).numpy()
    outs = {}
    for path in paths:
        monkeypatch.setattr(row_kernels, "int8_path", lambda path=path: path)
        outs[path] = np.empty((3, 300), np.float32)
        row_kernels.int8_products(x, w, scale, outs[path], kernels)
    assert all(np.array_equal(outs[p], outs[paths[0]]) for p in paths)


# numba compiling for another x86 CPU (its target machine; this CPU runs a subset of its code)
HASWELL = (
    "+64bit,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+cx8,+f16c,+fma,+fxsr,+lzcnt,+mmx,+movbe,+popcnt,+sse,+sse2,+sse3,+sse4.1,"
    "+sse4.2,+ssse3"
)
X86_64 = "+64bit,+cmov,+cx8,+fxsr,+mmx,+sse,+sse2"


# (numba's CPU name, its features, the int4 path and the int8 path it gets)
OTHER_CPUS = [("haswell", HASWELL, "avx2", "avx2"), ("x86-64", X86_64, "generic", "fp32")]


def test_each_cpu_compiles_into_the_data_folder_once_and_gets_its_own_paths(tmp_path):
    """The first process compiles into <data>/numba-cache every kernel this CPU runs, parallel and
    serial (none is left to compile on a first decoded token); the next reads it and writes nothing.
    Before that, as numba is told to compile for other CPUs in the same folder: an AVX2-only CPU
    runs the AVX2 paths (int4 and int8) and one with neither the generic int4 kernel and int8 with
    fp32 activations; a VNNI kernel refuses to compile there (a TypingError, not LLVM's abort); and
    each CPU, after the one before, is not served another's code (numba's cache is keyed on the
    CPU's name and features). One folder for all: each compile took 11.7 s alone on the 2-core
    AVX2-only EPYC. Where the suite itself runs as another CPU (NUMBA_CPU_NAME: an AVX2-only one
    simulated), only this CPU's part runs."""
    code = f"""
        import logging, sys
        logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
        import torch
        from engine.model import row_kernels
        k = row_kernels.load({str(tmp_path)!r})
        assert k is not None, row_kernels.unavailable()
        logging.disable(logging.INFO)
        int4, int8 = row_kernels.int4_path(), row_kernels.int8_path()
        runs = ["rows_f32", "rows_half", "rows_int4" if int4 == "generic" else "rows_q4_" + int4]
        runs += ["rows_int8" if int8 == "fp32" else "rows_q8_" + int8]
        runs += [] if row_kernels.bf16_path() == "fp32" else ["rows_bf16"]
        print("not-compiled", [n + s for n in runs for s in ("", "_serial") if not getattr(k, n + s).signatures])
        print("path", int4)
        g = torch.Generator().manual_seed(1)
        w, x = torch.randn(96, 200, generator=g), torch.randn(3, 200, generator=g)
        m = row_kernels.Int4Linear(row_kernels.Int4Weights.of(w), None, k)
        with torch.inference_mode():
            y = m(x)
        ref = row_kernels._int4_reference(x, m.weights)
        print("close", bool((y - ref).abs().max() <= 1e-5 * ref.abs().max()))
        import numba, numpy as np
        print("int8", int8)
        w8, x8 = torch.randint(-127, 128, (96, 256), generator=g).to(torch.int8), torch.randn(3, 256, generator=g)
        out = np.empty((3, 96), np.float32)
        row_kernels.int8_products(x8.numpy(), w8.numpy(), np.ones(96, np.float32), out, k)
        seen = row_kernels.fake_quantized_activations(x8) if int8 != "fp32" else x8
        ref = (seen.double() @ w8.double().T).numpy()
        print("close", bool(np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()))
        if int4 != "vnni512":
            q = row_kernels.Int4Weights.of(w, "avx2")
            try:
                k.rows_q4_vnni512_serial(
                    np.zeros((1, 64), np.int8), np.zeros((1, 16), np.int32), np.zeros((1, 2), np.float32),
                    q.nibbles.numpy(), q.scales.numpy(), np.empty((1, 96), np.float32),
                )
                print("vnni512 compiled")
            except numba.core.errors.TypingError:
                print("vnni512 refused")
    """
    cache = tmp_path / "numba-cache"

    def after_load(out: str) -> list[str]:  # what the code printed after its load, once all was compiled
        lines = out.splitlines()
        assert "not-compiled []" in lines, out
        return " ".join(lines[lines.index("not-compiled []") + 1 :]).split()

    entries = lambda: {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}  # noqa: E731
    code_files = lambda files: sum(p.suffix == ".nbc" for p in files)  # noqa: E731  (.nbi: their index)
    files: dict = {}
    for cpu, features, path, int8 in [] if "NUMBA_CPU_NAME" in os.environ else OTHER_CPUS:
        other = _run(code, {"NUMBA_CPU_NAME": cpu, "NUMBA_CPU_FEATURES": features})
        assert other.returncode == 0, other.stderr
        want = ["path", path, "close", "True", "int8", int8, "close", "True", "vnni512", "refused"]
        assert after_load(other.stdout) == want, cpu
        before, files = files, entries()
        assert code_files(files) > code_files(before), cpu
    here = _run(code)
    assert here.returncode == 0, here.stderr
    assert "one-row kernels: numba" in here.stdout and str(cache) in here.stdout
    want = ["path", row_kernels.int4_path(), "close", "True", "int8", row_kernels.int8_path(), "close", "True"]
    assert after_load(here.stdout)[:8] == want
    compiled = entries()
    # compiled anew for this CPU, beside the other CPUs' entries: code (.nbc) and its index (.nbi)
    assert code_files(compiled) > code_files(files)
    assert any(p.suffix == ".nbi" for p in compiled)
    again = _run(code)
    assert again.returncode == 0, again.stderr
    assert entries() == compiled  # read back: nothing compiled or written


@pytest.mark.parametrize(
    ("code", "user", "want"),
    [
        ("import engine", None, "2000"),
        ("import engine", "77", "77"),  # the user's own setting wins
        ("import torch, engine", None, "unset"),  # too late: torch's OpenMP has read its settings
    ],
)
def test_the_engine_shortens_torchs_openmp_spin_before_torch_loads(code, user, want):
    """Torch's OpenMP threads spin less between ops, so that numba's kernel threads get the cores
    (engine/__init__.py): set by importing the engine before torch, as every entry does."""
    env = {"GOMP_SPINCOUNT": user} if user else {}
    res = _run(f"import os; {code}; print(os.environ.get('GOMP_SPINCOUNT', 'unset'))", env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [want]
