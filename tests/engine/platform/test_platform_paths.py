"""Paths with spaces and non-ASCII characters everywhere a user can pick one: the model folder,
the data folder (history, picture cache, KV store) and picture file names, through the engine."""

from __future__ import annotations

import shutil

import pytest

from engine.protocol.events import Message
from tests.fixtures.pictures import make_picture, pics
from tests.helpers.engine_helpers import ask, expect_done, open_engine

pytestmark = pytest.mark.slow


def test_odd_model_data_and_picture_paths_give_the_same_replies(tiny_model, tmp_path):
    odd = tmp_path / "Mödelle und Daten 文件 ✓"
    model = odd / "tiny llava (copy)"
    shutil.copytree(tiny_model("llava"), model)
    picture = make_picture(odd / "Bild süß — 写真 1.png", seed=3)
    plain_picture = make_picture(tmp_path / "p.png", seed=3)
    turn = [Message("user", "what colour is the shape?", pics(picture))]

    engine = open_engine(model, odd / "data dir")
    try:
        first = expect_done(ask(engine, "c", turn))
    finally:
        engine.shutdown()  # spills the conversation to the KV store under the odd data folder
    engine = open_engine(model, odd / "data dir")
    try:
        again = expect_done(ask(engine, "c", turn))  # restored from disk, picture from the disk cache
    finally:
        engine.shutdown()
    assert again.stats.restored_tokens > 0
    plain = open_engine(tiny_model("llava"), tmp_path / "plain")
    try:
        want = expect_done(ask(plain, "c", [Message("user", "what colour is the shape?", pics(plain_picture))]))
    finally:
        plain.shutdown()
    assert first.token_ids == again.token_ids == want.token_ids
    assert any((odd / "data dir" / "image-cache").iterdir())
