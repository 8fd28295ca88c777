"""The image-cache gate: cached pictures give the same replies, never wake the encoder, survive
restarts, and a damaged or unusable cache costs a re-encode — never a crash or wrong features."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from engine.protocol.events import EncoderState, Message, PictureMarks, PicturePlace, TurnFailed
from tests.fixtures.pictures import make_picture, pics
from tests.fixtures.tiny_models import FAMILIES
from tests.helpers.engine_helpers import Reference, ask, expect_done, open_engine, wait_report

ROOT = Path(__file__).resolve().parents[3]
NEW = 6
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_features_give_the_fresh_encoding_reply(family, tiny_model, tmp_path):
    model_dir = tiny_model(family)
    ref = Reference(model_dir)
    a, b = make_picture(tmp_path / "a.png", 1), make_picture(tmp_path / "b.png", 2, size=(60, 44))
    engine = open_engine(model_dir, tmp_path / "d")
    try:
        first = [Message("user", "What is this?", pics(a, b))]
        d1 = expect_done(ask(engine, "one", first, NEW))
        assert d1.stats.image_cache_misses == 2 and d1.stats.pictures_encoded == 2
        # another conversation: no KV to reuse past the opening, both pictures come from the cache
        other = [Message("user", "Tell me about these.", pics(b, a))]
        d2 = expect_done(ask(engine, "two", other, NEW))
        assert d2.stats.image_cache_hits == 2 and d2.stats.pictures_encoded == 0
        assert d2.token_ids == ref.reply_ids(other, NEW)
        assert d1.token_ids == ref.reply_ids(first, NEW)
    finally:
        engine.shutdown()


def test_a_turns_end_says_where_its_pictures_are(tiny_model, tmp_path):
    """TurnDone.pictures: the marks a window shows come with the turn, by digest, for every
    picture of the conversation (the earlier turns' too), as a CheckPictures would say them."""
    a, b = make_picture(tmp_path / "a.png", 1), make_picture(tmp_path / "b.png", 2)
    ra, rb = pics(a, b)
    engine = open_engine(tiny_model("llava"), tmp_path / "d")
    marks: list[PictureMarks] = []
    got = threading.Event()

    def listen(e) -> None:
        if isinstance(e, PictureMarks):
            marks.append(e)
            got.set()

    engine.add_listener(listen)
    try:
        convo = [Message("user", "What is this?", [ra])]
        d1 = expect_done(ask(engine, "c", convo, NEW))
        assert d1.pictures == {ra.digest: PicturePlace.RAM}
        convo += [Message("assistant", d1.reply), Message("user", "And this?", [rb])]
        d2 = expect_done(ask(engine, "c", convo, NEW))
        assert d2.pictures == {ra.digest: PicturePlace.RAM, rb.digest: PicturePlace.RAM}
        assert marks == []  # nobody asked: the turn's end said it all
        engine.check_pictures([ra, rb])
        assert got.wait(30), "no PictureMarks"
        assert marks[0].places == d2.pictures  # the same words either way
    finally:
        engine.shutdown()


def test_all_hit_turn_never_wakes_the_unloaded_encoder(tiny_model, tmp_path):
    model_dir = tiny_model("qwen2_vl")
    ref = Reference(model_dir)
    a, b, c = (make_picture(tmp_path / f"{n}.png", i) for i, n in enumerate("abc"))
    engine = open_engine(model_dir, tmp_path / "d", elastic=True, elastic_idle_s=0.3)
    states: list[str] = []
    engine.add_listener(lambda e: states.append(e.state) if isinstance(e, EncoderState) else None)
    try:
        expect_done(ask(engine, "x", [Message("user", "first", pics(a, b))], NEW))
        rep = wait_report(engine, lambda r: r.encoder_state == "unloaded", timeout=10)
        assert rep.components["vision_encoder"] == 0
        idle_before = engine.gate.residency.last_used

        convo = [Message("user", "again", pics(b, a))]
        d = expect_done(ask(engine, "y", convo, NEW))
        assert d.stats.encoder_loads == 0 and d.stats.image_cache_hits == 2
        assert d.stats.encoder_resident is False
        assert engine.gate.residency.last_used == idle_before  # a hit does not refresh the idle clock
        assert wait_report(engine).components["vision_encoder"] == 0
        assert d.token_ids == ref.reply_ids(convo, NEW)

        # a new picture beside cached ones: one load, only the new picture encoded
        convo2 = [Message("user", "and now", pics(a, c, b))]
        d2 = expect_done(ask(engine, "z", convo2, NEW))
        assert d2.stats.encoder_loads == 1 and d2.stats.pictures_encoded == 1
        assert d2.stats.image_cache_hits == 2 and d2.stats.image_cache_misses == 1
        assert d2.stats.encoder_load_s > 0
        assert d2.token_ids == ref.reply_ids(convo2, NEW)  # reloaded weights are the real ones
        assert "loading" in states and "unloaded" in states
    finally:
        engine.shutdown()


def test_non_elastic_keeps_the_encoder_and_still_skips_hits(tiny_model, tmp_path):
    model_dir = tiny_model("llava")
    a = make_picture(tmp_path / "a.png", 1)
    engine = open_engine(model_dir, tmp_path / "d", elastic=False)
    try:
        expect_done(ask(engine, "x", [Message("user", "q", pics(a))], NEW))
        d = expect_done(ask(engine, "y", [Message("user", "r", pics(a))], NEW))
        assert d.stats.pictures_encoded == 0 and d.stats.encoder_resident is True
        engine.unload_encoder()
        assert wait_report(engine).components["vision_encoder"] > 0
    finally:
        engine.shutdown()


def test_picture_used_every_turn_survives_64_others(tiny_model, tmp_path):
    model_dir = tiny_model("llava")
    keep = make_picture(tmp_path / "keep.png", 1000)
    engine = open_engine(model_dir, tmp_path / "d", image_cache_entries=64, image_cache_disk_bytes=0)
    try:
        for i in range(66):
            other = make_picture(tmp_path / f"o{i}.png", i, size=(30, 30))
            d = expect_done(ask(engine, f"c{i}", [Message("user", "hi", pics(keep, other))], 1))
            if i > 0:
                assert d.stats.image_cache_ram_hits == 1, f"turn {i}: the picture used every turn was evicted"
        assert engine.gate.ram.evictions >= 2  # the others really did push entries out
        first_other = make_picture(tmp_path / "o0.png", 0, size=(30, 30))
        d = expect_done(ask(engine, "last", [Message("user", "hi", pics(first_other))], 1))
        assert d.stats.image_cache_misses == 1  # the oldest unused one is gone
    finally:
        engine.shutdown()


def test_renamed_picture_is_still_a_hit(tiny_model, tmp_path):
    engine = open_engine(tiny_model("llava"), tmp_path / "d")
    a = make_picture(tmp_path / "a.png", 5)
    try:
        expect_done(ask(engine, "x", [Message("user", "q", pics(a))], 2))
        moved = tmp_path / "sub" / "renamed.png"
        moved.parent.mkdir()
        a.rename(moved)
        d = expect_done(ask(engine, "y", [Message("user", "q", pics(moved))], 2))
        assert d.stats.image_cache_hits == 1
    finally:
        engine.shutdown()


def test_all_hit_turns_open_no_picture_file(tiny_model, tmp_path):
    """The ref's digest is the cache key: a hit (RAM, or disk after a restart) never opens the
    file, so a picture moved away after its first turn still answers, exactly."""
    model_dir = tiny_model("qwen2_vl")
    a = make_picture(tmp_path / "a.png", 4)
    convo = [Message("user", "What is this?", pics(a))]
    want = Reference(model_dir).reply_ids(convo, NEW)
    data = tmp_path / "d"
    engine = open_engine(model_dir, data)
    try:
        assert expect_done(ask(engine, "one", convo, NEW)).token_ids == want
        loads = engine.gate.residency.loads
        a.rename(tmp_path / "elsewhere.png")  # the ref now names no file at all
        d = expect_done(ask(engine, "two", convo, NEW))  # another conversation: no KV, only the cache
        assert d.stats.image_cache_ram_hits == 1 and d.stats.pictures_encoded == 0
        assert d.token_ids == want and engine.gate.residency.loads == loads
    finally:
        engine.shutdown()
    engine = open_engine(model_dir, data)
    try:
        d = expect_done(ask(engine, "three", convo, NEW))
        assert d.stats.image_cache_disk_hits == 1 and d.stats.encoder_loads == 0
        assert d.token_ids == want
    finally:
        engine.shutdown()


def test_a_picture_changed_behind_its_ref_fails_that_turn_alone(tiny_model, tmp_path):
    model_dir = tiny_model("llava")
    ref = Reference(model_dir)
    a, b = make_picture(tmp_path / "a.png", 1), make_picture(tmp_path / "b.png", 2)
    engine = open_engine(model_dir, tmp_path / "d")
    try:
        convo = [Message("user", "Describe this.", pics(b))]
        d1 = expect_done(ask(engine, "c", convo, NEW))
        stale = pics(a)
        make_picture(a, 3)  # the file is overwritten after it was attached
        convo += [Message("assistant", d1.reply), Message("user", "And this?", stale)]
        res = ask(engine, "c", convo, NEW)
        assert isinstance(res, TurnFailed)
        assert res.message == "The picture a.png changed on disk after it was attached; attach it again."
        assert engine.gate.counters["encodes"] == 1  # nothing of the changed file was encoded or cached
        convo[-1] = Message("user", "And this?", pics(a))  # attached again: its new content
        d2 = expect_done(ask(engine, "c", convo, NEW))
        assert d2.stats.reused_tokens >= d1.stats.prompt_tokens  # the conversation's KV was kept
        assert d2.token_ids == ref.reply_ids(convo, NEW)
    finally:
        engine.shutdown()


def replay(tmp_path, model, data, script) -> list[dict]:
    path = tmp_path / f"s{len(list(tmp_path.glob('s*.json')))}.json"
    path.write_text(json.dumps(script))
    res = subprocess.run(
        [sys.executable, str(ROOT / "main.py"), "replay", str(path), "--model", str(model), "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    return [json.loads(x) for x in res.stdout.splitlines()]


def test_restart_gives_a_disk_hit_without_a_load(tiny_model, tmp_path):
    model = tiny_model("idefics3")
    make_picture(tmp_path / "a.png", 7)
    data = tmp_path / "data"
    script = {"settings": {"max_new_tokens": 4}, "turns": [{"user": "what?", "images": ["a.png"]}]}
    first = replay(tmp_path, model, data, script)[0]["stats"]
    assert first["image_cache_misses"] == 1 and first["encoder_loads"] == 1
    second = replay(tmp_path, model, data, script)[0]["stats"]
    assert second["image_cache_disk_hits"] == 1 and second["encoder_loads"] == 0
    assert second["encoder_resident"] is False


def test_damaged_disk_entry_is_a_miss_that_re_encodes(tiny_model, tmp_path):
    model = tiny_model("llava")
    ref = Reference(model)
    a = make_picture(tmp_path / "a.png", 3)
    data = tmp_path / "data"
    engine = open_engine(model, data)
    expect_done(ask(engine, "x", [Message("user", "q", pics(a))], NEW))
    engine.shutdown()
    # flip bytes in every stored value (diskcache keeps larger values in files, small in SQLite)
    import diskcache

    with diskcache.Cache(str(data / "image-cache")) as dc:
        for k in list(dc.iterkeys()):
            blob = bytearray(dc[k])
            blob[len(blob) // 2] ^= 0xFF
            dc[k] = bytes(blob)
    engine = open_engine(model, data)
    try:
        convo = [Message("user", "q", pics(a))]
        d = expect_done(ask(engine, "y", convo, NEW))
        assert d.stats.image_cache_misses == 1 and d.stats.pictures_encoded == 1
        assert engine.gate.disk.damaged == 1
        assert d.token_ids == ref.reply_ids(convo, NEW)
    finally:
        engine.shutdown()


def test_unwritable_cache_dir_works_uncached_and_says_so(tiny_model, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "image-cache").write_text("a file where the cache folder should be")
    notices: list[str] = []
    engine = open_engine(tiny_model("llava"), data, notices)
    try:
        a = make_picture(tmp_path / "a.png", 3)
        d = expect_done(ask(engine, "x", [Message("user", "q", pics(a))], 3))
        d2 = expect_done(ask(engine, "y", [Message("user", "q", pics(a))], 3))
        assert d2.stats.image_cache_ram_hits == 1 and d.token_ids == d2.token_ids
        assert any("picture cache on disk is unavailable" in n for n in notices)
    finally:
        engine.shutdown()


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_unloading_the_encoder_really_frees_cuda_memory(tiny_model, tmp_path):
    import torch

    engine = open_engine(tiny_model("llava"), tmp_path / "d", device="cuda", elastic_idle_s=3600)
    try:
        expect_done(ask(engine, "x", [Message("user", "q", pics(make_picture(tmp_path / "a.png", 1)))], 2))
        need = engine.gate.residency.weight_bytes()
        before = torch.cuda.memory_allocated()
        engine.unload_encoder()
        rep = wait_report(engine, lambda r: r.encoder_state == "unloaded")
        assert rep.components["vision_encoder"] == 0
        assert before - torch.cuda.memory_allocated() >= need * 0.9
    finally:
        engine.shutdown()
