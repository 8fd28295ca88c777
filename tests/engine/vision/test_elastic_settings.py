"""Turning elastic residency on while the engine runs: the encoder it then releases must come
back from the model folder on the next picture, with the weights a fresh load would have."""

from __future__ import annotations

import pytest

from engine.protocol.events import Message
from tests.fixtures.pictures import make_picture, pics
from tests.helpers.engine_helpers import Reference, ask, expect_done, open_engine, wait_report

NEW = 6
pytestmark = pytest.mark.slow


def test_elastic_turned_on_at_run_time_reloads_the_encoder(tiny_model, tmp_path):
    model_dir = tiny_model("qwen2_vl")
    ref = Reference(model_dir)
    a = make_picture(tmp_path / "a.png", 1)
    engine = open_engine(model_dir, tmp_path / "d", elastic=False, elastic_idle_s=3600)
    try:
        assert wait_report(engine).encoder_state == "resident"
        engine.update_settings(elastic=True)
        engine.unload_encoder()
        rep = wait_report(engine, lambda r: r.encoder_state == "unloaded")
        assert rep.components["vision_encoder"] == 0  # the weights really went

        convo = [Message("user", "What is this?", pics(a))]
        d = expect_done(ask(engine, "c", convo, NEW))
        assert d.stats.encoder_loads == 1 and d.stats.pictures_encoded == 1
        assert d.token_ids == ref.reply_ids(convo, NEW)  # read back, not left empty or stale
        assert wait_report(engine).encoder_state == "resident"
    finally:
        engine.shutdown()


def test_elastic_turned_off_again_loads_the_encoder_back(tiny_model, tmp_path):
    model_dir = tiny_model("llava")
    ref = Reference(model_dir)
    a = make_picture(tmp_path / "a.png", 2)
    engine = open_engine(model_dir, tmp_path / "d", elastic=False, elastic_idle_s=3600)
    try:
        engine.update_settings(elastic=True)
        engine.unload_encoder()
        wait_report(engine, lambda r: r.encoder_state == "unloaded")
        engine.update_settings(elastic=False)  # non-elastic means always resident: load now
        rep = wait_report(engine, lambda r: r.encoder_state == "resident")
        assert rep.components["vision_encoder"] > 0
        convo = [Message("user", "And this?", pics(a))]
        d = expect_done(ask(engine, "c", convo, NEW))
        assert d.stats.encoder_loads == 0 and d.token_ids == ref.reply_ids(convo, NEW)
    finally:
        engine.shutdown()
