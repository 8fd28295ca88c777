"""An encoder load is over when its weights are in memory: no lazy file mapping is left for
the first encode to read, so `encoder_load_s` is the real cost of waking the encoder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from engine.protocol.events import Message
from tests.fixtures.pictures import make_picture, pics
from tests.helpers.engine_helpers import ask, expect_done, open_engine

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps"),
]


def file_mappings() -> list[tuple[int, int, str]]:
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].strip().startswith("/"):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                out.append((lo, hi, parts[5].strip()))
    return out


def backed_by(ptr: int, mappings) -> str | None:
    return next((name for lo, hi, name in mappings if lo <= ptr < hi), None)


def test_reloaded_encoder_weights_are_in_memory_not_mapped_from_the_file(tiny_model, tmp_path):
    model_dir = tiny_model("llava")
    engine = open_engine(model_dir, tmp_path / "d", elastic_idle_s=3600)
    try:
        expect_done(ask(engine, "c", [Message("user", "What is this?", pics(make_picture(tmp_path / "a.png", 1)))], 2))
        engine.unload_encoder()  # queued before the next turn: that turn reads the weights back
        pic = make_picture(tmp_path / "b.png", 2)
        done = expect_done(ask(engine, "c", [Message("user", "And this?", pics(pic))], 2))
        assert done.stats.encoder_loads == 1 and done.stats.encoder_load_s > 0
        weights = [p for p in engine.loaded.vision_parameters() if p.numel() > 0]
        assert weights
        maps = file_mappings()
        model_files = {str(f.resolve()) for f in Path(model_dir).glob("*.safetensors")}
        lazy = [backed_by(p.data_ptr(), maps) for p in weights]
        assert not [m for m in lazy if m in model_files], "encoder weights still map the model file"
    finally:
        engine.shutdown()
