"""Quantized language-model weights (int8, 4-bit): the model loads and answers, every fast path
is exact against a fresh prefill of the same weights, the vision encoder stays in full precision
(and still unloads / reloads), the memory ledger counts the quantized bytes, and a KV store
written with one weight format is never restored into another."""

from __future__ import annotations

import json

import pytest
import torch

from engine.device.ledger import model_bytes
from engine.model.load import load_model
from engine.model.packed_linear import PackedLinear
from engine.model.weights import is_quantized
from engine.protocol.events import Message
from engine.vision.residency import EncoderResidency
from tests.fixtures.pictures import make_picture, pics
from tests.fixtures.tiny_models import FAMILIES
from tests.helpers.engine_helpers import Reference, ask, expect_done, open_engine, spill_now, wait_report

pytestmark = pytest.mark.slow

NEW = 6
B = 16  # small KV blocks so a tiny conversation spans several


def _vision_tensors(loaded) -> dict[str, torch.Tensor]:
    out = {}
    for prefix in loaded.family.vision_modules:
        for name, p in loaded.module(prefix).named_parameters():
            out[f"{prefix}.{name}"] = p.detach()
    return out


def _int8_bytes_from_shapes(full) -> int:
    """Language-model bytes under Parley's int8 layout, from the full-precision model's module
    shapes alone: every Linear and the token embedding become int8 values plus one scale per
    row in the compute dtype (a tied output head shares the embedding's); the rest keeps its
    dtype."""
    vision = {id(t) for t in full.vision_parameters()}
    total, seen = 0, set()
    head = full.model.get_output_embeddings()
    for module in full.model.modules():
        if isinstance(module, PackedLinear):  # a full-precision linear on the CPU: its weight packed
            if module is head and _tied(full.path):
                continue  # int8 shares the embedding's table
            total += module.out_features * module.in_features + module.out_features * module.packed.element_size()
            if module.bias is not None:
                total += module.bias.numel() * module.bias.element_size()
            continue
        for name, t in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            if id(t) in vision or id(t) in seen:
                continue
            seen.add(id(t))
            if name == "weight" and isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                rows, cols = t.shape
                total += rows * cols + rows * t.element_size()
            else:
                total += t.numel() * t.element_size()
    return total


def _tied(folder) -> bool:
    """The folder stores no output head: it is the token embedding."""
    from safetensors import safe_open

    for f in folder.glob("*.safetensors"):
        with safe_open(f, framework="pt") as sf:
            if any(k.endswith("lm_head.weight") for k in sf.keys()):  # noqa: SIM118 (a safetensors file is not iterable)
                return False
    return True


@pytest.mark.parametrize("family", FAMILIES)
def test_int8_answers_and_every_fast_path_is_exact(family, tiny_model, tmp_path):
    model = tiny_model(family)
    a = pics(make_picture(tmp_path / "a.png", 1))[0]
    b = pics(make_picture(tmp_path / "b.png", 2, size=(64, 40)))[0]
    engine = open_engine(model, tmp_path / "data", weights="int8", block_tokens=B, spill_idle_s=3600)
    # the engine's int8 computes in the dtype it measured fastest here (calibrate.py); the
    # reference is the same weights in the same dtype
    ref = Reference(model, weights="int8", dtype=str(engine.loaded.dtype).removeprefix("torch."))
    try:
        chat = [Message("user", "Describe the first picture in a few words.", [a])]
        d1 = expect_done(ask(engine, "c", chat, NEW))
        assert d1.token_ids == ref.reply_ids(chat, NEW)
        assert d1.stats.weights == "int8"
        full = load_model(model, weights={torch.float32: "fp32", torch.bfloat16: "bf16"}[ref.loaded.dtype])
        assert d1.stats.weight_bytes == model_bytes(ref.loaded)[0] == _int8_bytes_from_shapes(full)
        # the KV cache holds the compute dtype, not int8
        layer = engine.sessions["c"].cache.layers[0]
        assert layer.keys.dtype == ref.loaded.dtype == engine.loaded.dtype

        # prefix reuse: the first turn's prompt is not run again
        chat += [Message("assistant", d1.reply), Message("user", "Now compare it with this one.", [b])]
        d2 = expect_done(ask(engine, "c", chat, NEW))
        assert d2.stats.reused_tokens >= d1.stats.prompt_tokens
        assert d2.token_ids == ref.reply_ids(chat, NEW)

        # cached picture: another conversation sends the same picture; the encoder is not run
        other = [Message("user", "What is this?", [a])]
        d3 = expect_done(ask(engine, "other", other, NEW))
        assert d3.stats.image_cache_hits == 1 and d3.stats.pictures_encoded == 0
        assert d3.token_ids == ref.reply_ids(other, NEW)

        # SSD restore
        chat += [Message("assistant", d2.reply)]
        assert spill_now(engine, "c").state == "spilled"
        chat += [Message("user", "Which has more red?", [])]
        d4 = expect_done(ask(engine, "c", chat, NEW))
        assert d4.stats.restored_tokens > 0
        assert d4.token_ids == ref.reply_ids(chat, NEW)
    finally:
        engine.shutdown()


def test_int8_with_bf16_decoded_rows_is_exact_on_every_fast_path(tmp_path, monkeypatch):
    """An fp32 int8 model whose decoded rows run in bf16 (what the calibration picks on an AVX2
    CPU without bf16 units): the engine's replies equal a fresh prefill's with the same plan,
    with KV reused and restored from the SSD too."""
    from engine.model import calibrate, speed
    from engine.model.int8_layers import Int8Linear
    from tests.fixtures.tiny_models import build_tiny_model

    monkeypatch.setattr(calibrate, "MIN_PARAMS", 0)  # the tiny model follows its record like a real one
    # widths that are multiples of 64: where the bf16 one-row kernel is trusted (FUSED_WIDTH_MULTIPLE)
    model = build_tiny_model("llava", tmp_path / "model", text={"hidden_size": 64, "intermediate_size": 128})
    data = tmp_path / "data"
    data.mkdir()
    shape = speed.LayerShape.of_config(json.loads((model / "config.json").read_text()))
    assert shape is not None
    speed.write(data, shape, [speed.FormatSpeed("int8", "float32", 4.0, 30.0, decode_dtype="bfloat16")])
    engine = open_engine(model, data, weights="int8", block_tokens=B, spill_idle_s=3600)
    ref = Reference(model, weights="int8", speed_dir=data)
    try:
        rows = [m for m in engine.loaded.model.modules() if type(m) is Int8Linear]
        assert rows and all(m.decode_scale is not None and m.decode_scale.dtype == torch.bfloat16 for m in rows)
        assert engine.loaded.dtype == ref.loaded.dtype == torch.float32
        chat = [
            Message("user", "Describe the first picture in a few words.", pics(make_picture(tmp_path / "a.png", 1)))
        ]
        d1 = expect_done(ask(engine, "c", chat, NEW))
        assert d1.token_ids == ref.reply_ids(chat, NEW)
        chat += [Message("assistant", d1.reply), Message("user", "And in more words?")]
        d2 = expect_done(ask(engine, "c", chat, NEW))
        assert d2.stats.reused_tokens >= d1.stats.prompt_tokens
        assert d2.token_ids == ref.reply_ids(chat, NEW)
        chat += [Message("assistant", d2.reply)]
        assert spill_now(engine, "c").state == "spilled"
        chat += [Message("user", "Which colour is it?")]
        d3 = expect_done(ask(engine, "c", chat, NEW))
        assert d3.stats.restored_tokens > 0
        assert d3.token_ids == ref.reply_ids(chat, NEW)
    finally:
        engine.shutdown()


@pytest.mark.parametrize("fmt", ["int8", "4bit"])
@pytest.mark.parametrize("family", FAMILIES)
def test_vision_stays_full_precision_and_still_unloads_and_reloads(family, fmt, tiny_model):
    model = tiny_model(family)
    full = load_model(model, weights="fp32")
    quant = load_model(model, weights=fmt)
    assert quant.weights == fmt and quant.dtype == full.dtype
    before, after = _vision_tensors(full), _vision_tensors(quant)
    assert before.keys() == after.keys() and before
    for name, t in before.items():
        q = after[name]
        assert not is_quantized(q), name
        assert q.dtype == t.dtype and q.numel() * q.element_size() == t.numel() * t.element_size(), name
        assert torch.equal(q, t), name
    lm_full, vision_full = model_bytes(full)
    lm_q, vision_q = model_bytes(quant)
    assert vision_q == vision_full
    assert lm_q < lm_full * (0.5 if fmt == "int8" else 0.75)
    # every language-model matrix that the format covers is quantized (the skip list is right)
    in_lm = lambda n: not n.startswith(tuple(p + "." for p in quant.family.vision_modules))  # noqa: E731
    if fmt == "int8":  # all of them, token embedding and output head included
        assert not [n for n, m in quant.model.named_modules() if type(m) is torch.nn.Linear and in_lm(n)]
        assert all(is_quantized(p) for n, p in quant.model.named_parameters() if in_lm(n) and p.dim() == 2)
        assert is_quantized(quant.model.get_input_embeddings().weight)
    else:  # NF4: the linear layers, output head excepted
        lm_linears = [
            m
            for n, m in quant.model.named_modules()
            if isinstance(m, torch.nn.Linear) and in_lm(n) and m is not quant.model.get_output_embeddings()
        ]
        assert lm_linears and all(is_quantized(m.weight) for m in lm_linears)

    # the elastic encoder releases and reads back the folder's full-precision weights
    residency = EncoderResidency(quant, elastic=True, idle_s=60)
    assert residency.disabled_reason is None
    assert residency.unload() and model_bytes(quant)[1] == 0
    assert residency.ensure_loaded()
    for name, t in _vision_tensors(quant).items():
        assert t.dtype == before[name].dtype and torch.equal(t, before[name]), name
    assert model_bytes(quant) == (lm_q, vision_full)


def test_4bit_answers_exactly_against_its_own_prefill(tiny_model, tmp_path):
    model = tiny_model("qwen2_vl")
    ref = Reference(model, weights="4bit")
    a = pics(make_picture(tmp_path / "a.png", 3))[0]
    engine = open_engine(model, tmp_path / "data", weights="4bit")
    try:
        chat = [Message("user", "What is in this picture?", [a])]
        d1 = expect_done(ask(engine, "c", chat, NEW))
        assert d1.token_ids == ref.reply_ids(chat, NEW)
        chat += [Message("assistant", d1.reply), Message("user", "And the colours?", [])]
        d2 = expect_done(ask(engine, "c", chat, NEW))
        assert d2.stats.reused_tokens >= d1.stats.prompt_tokens
        assert d2.token_ids == ref.reply_ids(chat, NEW)
        assert d2.stats.weights == "4bit"
        assert d2.stats.weight_bytes == model_bytes(ref.loaded)[0]
        assert d2.stats.weight_bytes < model_bytes(load_model(model, weights="fp32"))[0] * 0.75
        report = wait_report(engine)
        assert report.components["language_model"] == d2.stats.weight_bytes
    finally:
        engine.shutdown()


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
def test_kv_store_of_other_weights_is_never_restored(family, tiny_model, tmp_path):
    model = tiny_model(family)
    data = tmp_path / "data"
    a = pics(make_picture(tmp_path / "a.png", 5))[0]
    chat = [Message("user", "Describe this picture in a few words, please.", [a])]
    engine = open_engine(model, data, weights="fp32", block_tokens=B, spill_idle_s=3600)
    try:
        d1 = expect_done(ask(engine, "c", chat, NEW))
    finally:
        engine.shutdown()  # exit spills the conversation into the store
    chat += [Message("assistant", d1.reply), Message("user", "Tell me more.", [])]

    # the store restores into the weights that wrote it (and spills again on exit)
    engine = open_engine(model, data, weights="fp32", block_tokens=B, spill_idle_s=3600)
    try:
        d2 = expect_done(ask(engine, "c", chat, NEW))
        assert d2.stats.restored_tokens > 0
        assert d2.token_ids == Reference(model, weights="fp32").reply_ids(chat, NEW)
    finally:
        engine.shutdown()

    engine = open_engine(model, data, weights="int8", block_tokens=B, spill_idle_s=3600)
    try:
        d3 = expect_done(ask(engine, "c", chat, NEW))
        # a miss: nothing restored, the whole prompt recomputed with the int8 weights
        assert d3.stats.restored_tokens == 0 and d3.stats.reused_tokens == 0
        assert d3.stats.prefill_tokens == d3.stats.prompt_tokens
        assert wait_report(engine).store.restores == 0
        assert d3.token_ids == Reference(model, weights="int8").reply_ids(chat, NEW)
    finally:
        engine.shutdown()


@pytest.mark.parametrize(
    ("fmt", "family"),
    [("int4", "llava"), ("int4", "qwen2_vl"), ("fp32", "llava"), ("bf16", "qwen2_vl"), ("int8", "llava")],
)
def test_numba_decoded_rows_are_exact_on_every_fast_path(fmt, family, tiny_model, tmp_path, monkeypatch):
    """Decoded rows through numba's kernels (int4's only kernel; the others where the calibration
    measured them faster, recorded here): the engine's replies equal a fresh prefill's with the
    same plan, with KV reused, drafts checked, and KV restored from the SSD."""
    from engine.model import calibrate, speed
    from engine.model.int8_layers import Int8Linear
    from engine.model.row_kernels import Int4Linear, RowLinear

    monkeypatch.setattr(calibrate, "MIN_PARAMS", 0)  # the tiny model follows its record like a real one
    model = tiny_model(family)
    data = tmp_path / "data"
    data.mkdir()
    shape = speed.LayerShape.of_config(json.loads((model / "config.json").read_text()))
    assert shape is not None
    dtype = {"bf16": "bfloat16"}.get(fmt, "float32")
    speed.write(data, shape, [speed.FormatSpeed(fmt, dtype, 4.0, 30.0, rows=True)])
    engine = open_engine(model, data, weights=fmt, block_tokens=B, spill_idle_s=3600)
    ref = Reference(model, weights=fmt, speed_dir=data)
    try:
        kind = {"int4": Int4Linear, "int8": Int8Linear}.get(fmt, RowLinear)
        assert any(type(m) is kind for m in engine.loaded.model.modules())
        if fmt == "int8":
            assert all(m.rows is not None for m in engine.loaded.model.modules() if type(m) is Int8Linear)
        if fmt != "int4":  # q/k/v and gate/up decode in one call each (shared_input.py)
            assert any(getattr(m, "shared_input", None) is not None for m in engine.loaded.model.modules())
        assert engine.loaded.fingerprint == ref.loaded.fingerprint
        chat = [
            Message("user", "Describe the first picture in a few words.", pics(make_picture(tmp_path / "a.png", 1)))
        ]
        d1 = expect_done(ask(engine, "c", chat, NEW))
        assert d1.token_ids == ref.reply_ids(chat, NEW)
        assert d1.stats.weights == fmt
        # repeated text: prompt-lookup drafts go through the kernels as a few rows at once
        chat += [Message("assistant", d1.reply), Message("user", "Say it again: " + d1.reply + " " + d1.reply)]
        d2 = expect_done(ask(engine, "c", chat, NEW))
        assert d2.stats.reused_tokens >= d1.stats.prompt_tokens
        assert d2.token_ids == ref.reply_ids(chat, NEW)
        chat += [Message("assistant", d2.reply)]
        assert spill_now(engine, "c").state == "spilled"
        chat += [Message("user", "Which colour is it?")]
        d3 = expect_done(ask(engine, "c", chat, NEW))
        assert d3.stats.restored_tokens > 0
        assert d3.token_ids == ref.reply_ids(chat, NEW)
    finally:
        engine.shutdown()
