"""Speed on the CPU: full-precision linears prepacked for oneDNN compute their own weights and
are counted in the memory ledger and the KV namespace; `auto` follows this machine's measured
format speeds (measured once per machine and model shape, kept in the data folder, readable
without torch) and says why in the status bar."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from engine.device.ledger import model_bytes
from engine.model import calibrate, packed_linear, speed
from engine.model.load import load_model
from engine.model.packed_linear import PackedLinear
from engine.model.speed import FormatSpeed, LayerShape
from engine.model.weights import WeightPlan, estimate_bytes, plan_weights
from engine.protocol.events import Message
from tests.helpers.engine_helpers import ask, expect_done, open_engine

ROOT = Path(__file__).resolve().parents[3]
CPU = torch.device("cpu")
GIB = 1 << 30
SHAPE = LayerShape(hidden=64, intermediate=128, q_width=64, kv_width=32, layers=2, vocab=100)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 11, 300])
def test_a_packed_linear_computes_its_own_weights(dtype, rows):
    if not packed_linear.available(dtype):
        pytest.skip(f"this CPU's oneDNN has no {dtype}")
    g = torch.Generator().manual_seed(rows)
    linear = nn.Linear(1536, 640, dtype=dtype)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(640, 1536, generator=g) * 0.05)
        linear.bias.copy_(torch.randn(640, generator=g))
    packed = PackedLinear.of(linear)
    x = torch.randn(2, rows, 1536, generator=g).to(dtype)
    with torch.inference_mode():
        y = packed(x)
    ref = x.double() @ linear.weight.double().T + linear.bias.double()
    assert y.shape == (2, rows, 640) and y.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert (y.double() - ref).abs().max() <= tol * ref.abs().max()


@pytest.mark.skipif(
    not packed_linear.available(torch.bfloat16),
    reason="this CPU's oneDNN runs no bf16 linears (no AVX512_BF16 or AMX): a bf16 model is not packed here",
)
def test_a_packed_model_is_counted_and_named(tmp_path):
    """Every language-model linear (the tied output head too) is packed, the vision tower is
    not; the ledger counts the packed weights, the size estimate predicts them, and the KV store
    namespace names the layout."""
    from tests.fixtures.published_configs import build_published

    # Qwen2-VL-2B's widths and tied head, one layer each side, a small vocabulary
    model = build_published("Qwen2-VL-2B-Instruct", root=tmp_path, layers=1, vision_layers=1, vocab_size=2048)
    loaded = load_model(model, device="cpu", weights="bf16")
    vision = tuple(m + "." for m in loaded.family.vision_modules)
    kinds = {
        (n.startswith(vision), type(m).__name__)
        for n, m in loaded.model.named_modules()
        if isinstance(m, (nn.Linear, PackedLinear))
    }
    assert kinds == {(False, "PackedLinear"), (True, "Linear")}
    assert isinstance(loaded.model.get_output_embeddings(), PackedLinear)
    lm, vis = model_bytes(loaded)
    need = estimate_bytes(model, "qwen2_vl", "bf16", torch.bfloat16, packed=True)
    assert abs(lm + vis - need) < 0.01 * need  # the rest: buffers the files do not hold (rotary tables)
    assert estimate_bytes(model, "qwen2_vl", "bf16", torch.bfloat16, packed=True) > estimate_bytes(
        model, "qwen2_vl", "bf16", torch.bfloat16
    )  # the tied head's own copy
    packed, plain = WeightPlan("bf16", torch.bfloat16, packed=True), WeightPlan("bf16", torch.bfloat16)
    assert packed.fingerprint_part() == f"kernel={packed_linear.LAYOUT}".encode() and plain.fingerprint_part() == b""


def _speeds(**turns) -> dict[str, FormatSpeed]:
    """Measurements as calibrate.py records them: fmt=(decode tok/s, prefill tok/s, compute dtype,
    faster packed)."""
    return {f: FormatSpeed(f, dt, dec, pre, packed) for f, (dec, pre, dt, packed) in turns.items()}


def test_auto_follows_the_measured_speeds_and_says_why(tiny_model):
    model = tiny_model("llava")
    bf16_fast = _speeds(
        fp32=(3.0, 60, "float32", False), bf16=(6.0, 200, "bfloat16", True), int8=(8.0, 190, "bfloat16", False)
    )
    plan = plan_weights(model, "llava", CPU, "auto", "auto", 64 * GIB, bf16_fast)
    assert (plan.format, plan.dtype, plan.packed) == ("bf16", torch.bfloat16, packed_linear.available(torch.bfloat16))
    assert plan.note == (
        "Weights: bf16 — fastest here (measured on this CPU: bf16 6.0 tok/s decoding, 200 "
        "prefilling; fp32 3.0 tok/s decoding, 60 prefilling)"
    )
    fp32_fast = _speeds(fp32=(6.0, 200, "float32", False), bf16=(2.0, 90, "bfloat16", False))
    plan = plan_weights(model, "llava", CPU, "auto", "auto", 64 * GIB, fp32_fast)
    assert (plan.format, plan.packed) == ("fp32", False)
    # packed or plain as measured, also when the format is chosen by hand
    assert not plan_weights(model, "llava", CPU, "auto", "bf16", 64 * GIB, fp32_fast).packed
    # a quantized format computes in the dtype it ran fastest with, unless one was asked for
    assert plan_weights(model, "llava", CPU, "auto", "int8", 64 * GIB, bf16_fast).dtype == torch.bfloat16
    assert plan_weights(model, "llava", CPU, "float32", "int8", 64 * GIB, bf16_fast).dtype == torch.float32
    # ... and its decoded rows in the dtype they ran fastest in (no bf16 units: fp32 prompts, bf16 rows)
    mixed = {"int8": FormatSpeed("int8", "float32", 3.8, 30.0, decode_dtype="bfloat16")}
    plan = plan_weights(model, "llava", CPU, "auto", "int8", 64 * GIB, mixed)
    assert (plan.dtype, plan.decode_dtype) == (torch.float32, torch.bfloat16)
    assert plan.fingerprint_part().endswith(b";decode=torch.bfloat16")
    assert plan_weights(model, "llava", CPU, "auto", "int8", 64 * GIB, bf16_fast).decode_dtype is None
    # int8 is never picked for speed alone: only when full precision does not fit
    need = estimate_bytes(model, "llava", "int8", torch.bfloat16)
    assert plan_weights(model, "llava", CPU, "auto", "auto", int(need * 1.1) + 1, bf16_fast).format == "int8"
    # without measurements (a model below calibrate.MIN_PARAMS): full precision first, as before
    assert plan_weights(model, "llava", CPU, "auto", "auto", 64 * GIB, {}).format == "fp32"
    # 4-bit on a CPU loads, and the status bar says plainly what it is for
    assert (
        plan_weights(model, "llava", CPU, "auto", "4bit", 64 * GIB, bf16_fast).note
        == "Weights: 4bit — NF4 is for CUDA: on a CPU it saves memory but decodes several times slower than bf16; "
        "int4 is the CPU's 4-bit format"
    )


def test_the_speed_record_is_kept_per_machine_and_shape_and_survives_damage(tmp_path):
    rows = [
        FormatSpeed("bf16", "bfloat16", 6.5, 210.0, True),
        FormatSpeed("fp32", "float32", 3.1, 60.0),
        FormatSpeed("int8", "float32", 3.8, 30.0, decode_dtype="bfloat16"),
    ]
    speed.write(tmp_path, SHAPE, rows)
    other = LayerShape(128, 256, 128, 64, 2, 100)
    speed.write(tmp_path, other, rows[:1])
    assert speed.read(tmp_path, SHAPE) == {r.format: r for r in rows}
    assert list(speed.read(tmp_path, other)) == ["bf16"]
    doc = json.loads((tmp_path / speed.FILE).read_text())
    doc["machines"]["another-cpu"] = {"machine": {"cpu": "elsewhere"}, "shapes": {}}
    (tmp_path / speed.FILE).write_text(json.dumps(doc))
    speed.write(tmp_path, SHAPE, rows[1:])  # re-measured here: the other machine's record stays
    assert "another-cpu" in json.loads((tmp_path / speed.FILE).read_text())["machines"]
    (tmp_path / speed.FILE).write_text("{not json")
    assert speed.read(tmp_path, SHAPE) == {}
    speed.write(tmp_path, SHAPE, rows)  # a damaged record is replaced, not a crash
    assert speed.read(tmp_path, SHAPE)["fp32"].decode_tok_s == 3.1


def test_the_record_is_read_without_torch(tmp_path):
    speed.write(tmp_path, SHAPE, [FormatSpeed("bf16", "bfloat16", 6.5, 210.0)])
    code = (
        "import sys; from engine.model import speed; "
        f"s = speed.LayerShape.of_config({{'text_config': {{'hidden_size': 64, 'intermediate_size': 128, "
        f"'num_attention_heads': 2, 'num_key_value_heads': 1, 'num_hidden_layers': 2, 'vocab_size': 100}}}}); "
        f"r = speed.read({str(tmp_path)!r}, s); "
        "assert 'torch' not in sys.modules, 'torch was imported'; print(r['bf16'].decode_tok_s)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "6.5", out.stderr


def test_the_engine_measures_once_per_shape_and_tells_the_user(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setattr(calibrate, "MIN_PARAMS", 0)  # the tiny model is measured like a real one
    model = tiny_model("llava")
    data = tmp_path / "data"
    notices: list[str] = []
    engine = open_engine(model, data, notices=notices)
    try:
        done = expect_done(ask(engine, "c", [Message("user", "Hello")], 3))
    finally:
        engine.shutdown()
    shape = LayerShape.of_config(json.loads((model / "config.json").read_text()))
    record = speed.read(data, shape)
    assert {"fp32", "bf16", "int8"} <= set(record)
    fastest = min(("fp32", "bf16"), key=lambda f: record[f].turn_s())
    assert done.stats.weights == fastest
    assert [n for n in notices if n.startswith(f"Weights: {fastest} — fastest here (measured on this CPU: ")]
    written = (data / speed.FILE).stat().st_mtime_ns
    measured, measure = [], calibrate.measure
    monkeypatch.setattr(calibrate, "measure", lambda *a, **k: measured.append(a) or measure(*a, **k))
    engine = open_engine(model, data)
    try:
        assert engine.loaded.weights == fastest
    finally:
        engine.shutdown()
    assert measured == [] and (data / speed.FILE).stat().st_mtime_ns == written


def test_a_format_is_timed_by_the_wall_clock_the_user_waits_on():
    """A kernel that leaves a core idle (one thread of two, or stalled) costs its whole time: the
    calibration once shared CPU time out over torch's threads, which made MKL's one-thread fp32
    one-row product look twice as fast as it is and beat oneDNN's two-thread one."""
    waits = [functools.partial(time.sleep, 0.02)] * 3  # no CPU time at all
    assert calibrate._seconds(waits, repeats=2) >= 0.06


def test_a_growing_kv_layer_holds_what_concatenation_would_and_copies_only_when_full():
    from transformers.cache_utils import DynamicLayer

    from engine.kvstore.layout import layer_refusal
    from engine.model.kv_growth import ROOM_MIN, GrowingLayer

    g = torch.Generator().manual_seed(0)
    plain, grown = DynamicLayer(), GrowingLayer()
    steps = [300] + [1] * (ROOM_MIN + 50) + [5]  # a prompt, decoded tokens past the first room, a draft
    buffers = set()
    for i, n in enumerate(steps):
        k, v = torch.randn(1, 2, n, 8, generator=g), torch.randn(1, 2, n, 8, generator=g)
        want = plain.update(k, v)
        got = grown.update(k, v)
        assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
        buffers.add(grown.held()[0].data_ptr())
        if i == 20:  # a rejected draft is cropped away; the next tokens overwrite its room
            plain.crop(-7)
            grown.crop(-7)
    assert len(buffers) == 2  # the prompt's room, then one regrowth
    assert torch.equal(plain.keys, grown.keys) and grown.get_seq_length() == plain.get_seq_length()
    held = sum(t.numel() * t.element_size() for t in grown.held())
    filled = 2 * grown.keys.numel() * grown.keys.element_size()
    assert filled <= held <= filled * 1.125 + 2 * 2 * ROOM_MIN * 8 * 4
    assert layer_refusal(grown) is None  # spilled to the KV store like a DynamicLayer


def test_a_quantized_format_in_a_near_tie_computes_in_the_dtype_that_prefilled_faster():
    """int8 decoding through numba runs the same kernel in fp32 and bf16, so its two candidates
    differ by noise: within calibrate.TIE the dtype whose full-precision model prefilled faster
    wins (the untimed rest of the model runs in it); outside it the faster turn still wins."""

    def fs(fmt, dtype, decode, prefill):
        return FormatSpeed(fmt, dtype, decode_tok_s=decode, prefill_tok_s=prefill, rows=True)

    dense = [fs("fp32", "float32", 6.0, 170.0), fs("bf16", "bfloat16", 11.0, 340.0)]
    tie = {
        s.format: s.dtype
        for s in calibrate._fastest([*dense, fs("int8", "float32", 12.0, 170.0), fs("int8", "bfloat16", 11.0, 176.0)])
    }
    assert tie == {"fp32": "float32", "bf16": "bfloat16", "int8": "bfloat16"}
    clear = calibrate._fastest([*dense, fs("int8", "float32", 20.0, 170.0), fs("int8", "bfloat16", 11.0, 176.0)])
    assert {s.format: s.dtype for s in clear}["int8"] == "float32"
    # where bf16 prefilled slower (no bf16 units), the tie goes to fp32
    slow16 = [fs("fp32", "float32", 6.0, 170.0), fs("bf16", "bfloat16", 5.0, 40.0)]
    tie32 = calibrate._fastest([*slow16, fs("int8", "bfloat16", 12.0, 60.0), fs("int8", "float32", 11.5, 58.0)])
    assert {s.format: s.dtype for s in tie32}["int8"] == "float32"


def test_a_quantized_format_in_bf16_is_not_timed_where_its_prompts_alone_would_lose():
    """On a CPU without bf16 units each bf16 prompt pass costs the first launch seconds and never
    wins: a quantized format's bf16 candidate is skipped when even prefilling at PREFILL_BOUND
    times the bf16 model and decoding in no time its turn is slower than one already timed; it is
    timed wherever it could still win."""

    def fs(fmt, dtype, decode, prefill, rows=True):
        return FormatSpeed(fmt, dtype, decode_tok_s=decode, prefill_tok_s=prefill, rows=rows)

    # the AVX2-only EPYC's calibration: bf16 prefilled 113 tok/s, int8 in fp32 took 1.71 s a turn
    no_units = [fs("fp32", "float32", 63.5, 512.0), fs("bf16", "bfloat16", 95.4, 113.0, rows=False)]
    int8_fp32 = fs("int8", "float32", 189.5, 496.0)
    assert calibrate._cannot_win("int8", "bfloat16", [*no_units, int8_fp32]).startswith("its prompts alone")
    assert calibrate._cannot_win("int4", "bfloat16", [*no_units, int8_fp32]) == ""  # no int4 timed yet
    # with bf16 units (the Zen 4: bf16 prefilled faster than fp32) every candidate is timed
    units = [fs("fp32", "float32", 6.0, 170.0), fs("bf16", "bfloat16", 11.0, 340.0, rows=False)]
    assert calibrate._cannot_win("int8", "bfloat16", [*units, fs("int8", "float32", 12.0, 170.0)]) == ""
    # nor is anything skipped before the dense model in that dtype was timed, or for full precision
    assert calibrate._cannot_win("int8", "bfloat16", [no_units[0], int8_fp32]) == ""
    assert calibrate._cannot_win("bf16", "bfloat16", [*no_units, int8_fp32]) == ""
    # the bound is torch's bf16 prompt path, not the bf16 model's numba rows, whose prompts may
    # run in fp32 (row_kernels.half_prompt_path) as int8's and int4's in bf16 do not
    fast_rows = fs("bf16", "bfloat16", 102.3, 480.0)
    assert calibrate._cannot_win("int8", "bfloat16", [*no_units, fast_rows, int8_fp32]) != ""
    # the bound itself: the floor is the prompt at PREFILL_BOUND × 113 tok/s; an fp32 turn just
    # longer than it leaves bf16 a chance (timed), one just shorter does not (skipped)
    floor = speed.TURN_PROMPT / (calibrate.PREFILL_BOUND * 113.0)
    near = fs("int8", "float32", speed.TURN_REPLY / (floor * 0.5), speed.TURN_PROMPT / (floor * 0.5))
    assert near.turn_s() == pytest.approx(floor)
    slower = fs("int8", "float32", near.decode_tok_s * 0.99, near.prefill_tok_s * 0.99)
    faster = fs("int8", "float32", near.decode_tok_s * 1.01, near.prefill_tok_s * 1.01)
    assert calibrate._cannot_win("int8", "bfloat16", [*no_units, slower]) == ""
    assert calibrate._cannot_win("int8", "bfloat16", [*no_units, faster]) != ""
