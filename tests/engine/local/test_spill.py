"""Session spill through the engine: idle conversations go to SSD, come back exact (also after a
restart), later spills write only new blocks, and damage or a bad disk never costs a reply."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.protocol.events import EncoderState, Message, SpillState
from tests.fixtures.pictures import make_picture, pics
from tests.fixtures.tiny_models import FAMILIES
from tests.helpers.engine_helpers import Reference, ask, expect_done, open_engine, spill_now, wait_report

ROOT = Path(__file__).resolve().parents[3]
NEW = 6
B = 16  # small blocks so tiny conversations span several
pytestmark = pytest.mark.slow


def conversation(tmp_path):
    a = make_picture(tmp_path / "a.png", 1)
    b = make_picture(tmp_path / "b.png", 2, size=(64, 40))
    return [
        ("Describe the first picture in a few words, please.", pics(a)),
        ("Now compare it with this one.", pics(b)),
        ("Which has more red?", []),
        ("Last question about both pictures.", pics(a)),
    ]


@pytest.mark.parametrize("family", FAMILIES)
def test_spill_restore_and_restart_are_exact(family, tiny_model, tmp_path):
    model = tiny_model(family)
    ref = Reference(model)
    data = tmp_path / "data"
    engine = open_engine(model, data, block_tokens=B, spill_idle_s=3600)
    script = conversation(tmp_path)
    messages: list[Message] = []
    try:
        for n, (text, imgs) in enumerate(script[:3]):
            messages.append(Message("user", text, imgs))
            d = expect_done(ask(engine, "c", messages, NEW))
            assert d.token_ids == ref.reply_ids(messages, NEW), f"turn {n}"
            messages.append(Message("assistant", d.reply))
            if n == 1:
                assert spill_now(engine, "c").state == "spilled"
                assert engine.sessions["c"].cache is None  # the memory really went
        # turn 2 above was restored from SSD
    finally:
        engine.shutdown()  # exit spills the hot conversation
    engine = open_engine(model, data, block_tokens=B, spill_idle_s=3600)
    try:
        text, imgs = script[3]
        messages.append(Message("user", text, imgs))
        d = expect_done(ask(engine, "c", messages, NEW))
        assert d.stats.restored_tokens > 0 and d.stats.reused_tokens == 0
        assert d.stats.prefill_tokens == d.stats.prompt_tokens - d.stats.restored_tokens
        assert d.token_ids == ref.reply_ids(messages, NEW)
    finally:
        engine.shutdown()


def test_idle_timer_spills_and_the_next_turn_restores(tiny_model, tmp_path):
    model = tiny_model("qwen2_vl")
    ref = Reference(model)
    engine = open_engine(model, tmp_path / "d", block_tokens=B, spill_idle_s=0.3)
    spilled = threading.Event()
    engine.add_listener(lambda e: spilled.set() if isinstance(e, SpillState) and e.state == "spilled" else None)
    try:
        (t1, i1), (t2, i2) = conversation(tmp_path)[:2]
        msgs = [Message("user", t1, i1)]
        d1 = expect_done(ask(engine, "c", msgs, NEW))
        assert spilled.wait(30) and engine.sessions["c"].cache is None
        msgs += [Message("assistant", d1.reply), Message("user", t2, i2)]
        d2 = expect_done(ask(engine, "c", msgs, NEW))
        assert d2.stats.restored_tokens >= d1.stats.prompt_tokens - B
        assert d2.stats.spill_blocks_written > 0
        assert d2.token_ids == ref.reply_ids(msgs, NEW)  # Qwen positions after a restore
    finally:
        engine.shutdown()


def test_follow_up_spill_writes_only_new_blocks_and_openings_are_shared(tiny_model, tmp_path):
    model = tiny_model("llava")
    engine = open_engine(model, tmp_path / "d", block_tokens=B, spill_idle_s=3600)
    try:
        script = conversation(tmp_path)
        msgs = [Message("user", *script[0])]
        d = expect_done(ask(engine, "c", msgs, NEW))
        msgs.append(Message("assistant", d.reply))
        msgs.append(Message("user", *script[1]))
        d = expect_done(ask(engine, "c", msgs, NEW))
        spill_now(engine, "c")
        first = engine.spill_scheduler.store.counters["blocks_written"]
        session = engine.sessions["c"]
        n_before = len(session.ids) if session.cache is not None else d.stats.prompt_tokens + NEW - 1
        msgs += [Message("assistant", d.reply), Message("user", "A short follow-up.")]
        d3 = expect_done(ask(engine, "c", msgs, NEW))
        n_after = len(engine.sessions["c"].ids)
        spill_now(engine, "c")
        written = engine.spill_scheduler.store.counters["blocks_written"] - first
        k = n_after - n_before
        assert written <= -(-k // B) + 1, f"follow-up spill of +{k} tokens wrote {written} blocks"
        assert engine.spill_scheduler.store.counters["reused_blobs"] > 0
        # a second conversation with the same opening stores no block twice
        before = engine.spill_scheduler.store.counters["blocks_written"]
        expect_done(ask(engine, "other", msgs[:1], NEW))
        spill_now(engine, "other")
        assert engine.spill_scheduler.store.counters["blocks_written"] - before <= 1
        assert d3.stats.restored_tokens > 0
    finally:
        engine.shutdown()


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_damaged_blobs_are_detected_counted_and_recomputed(damage, tiny_model, tmp_path):
    model = tiny_model("idefics3")
    ref = Reference(model)
    data = tmp_path / "d"
    engine = open_engine(model, data, block_tokens=B, spill_idle_s=3600)
    (t1, i1), (t2, i2) = conversation(tmp_path)[:2]
    msgs = [Message("user", t1, i1)]
    d1 = expect_done(ask(engine, "c", msgs, NEW))
    engine.shutdown()
    blobs = sorted((data / "kv-store" / "blobs").rglob("*"), key=lambda p: p.stat().st_mtime)
    blobs = [p for p in blobs if p.is_file()]
    assert len(blobs) >= 3
    victim = blobs[1]
    if damage == "flip":
        raw = bytearray(victim.read_bytes())
        raw[-10] ^= 0x40
        victim.write_bytes(bytes(raw))
    elif damage == "truncate":
        victim.write_bytes(victim.read_bytes()[:-7])
    else:
        victim.unlink()
    engine = open_engine(model, data, block_tokens=B, spill_idle_s=3600)
    try:
        msgs += [Message("assistant", d1.reply), Message("user", t2, i2)]
        d2 = expect_done(ask(engine, "c", msgs, NEW))
        assert d2.token_ids == ref.reply_ids(msgs, NEW)  # never served, recomputed from text
        c = engine.spill_scheduler.store.counters
        assert c["bad_blobs"] + c["missing_blobs"] >= 1
        assert d2.stats.restored_tokens < d1.stats.prompt_tokens
    finally:
        engine.shutdown()


def test_unwritable_store_keeps_conversations_hot(tiny_model, tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    (data / "kv-store").write_text("a file where the store folder should be")
    notices: list[str] = []
    engine = open_engine(tiny_model("llava"), data, notices, block_tokens=B, spill_idle_s=0.1)
    try:
        msgs = [Message("user", "hello there")]
        d = expect_done(ask(engine, "c", msgs, NEW))
        # past spill_idle_s the idle spill_scheduler has nothing it can spill (the store folder cannot be
        # made), and the engine says so: nothing lost, the conversation stays hot
        time.sleep(max(0.0, engine.sessions["c"].last_used + 0.1 - time.monotonic()))  # the idle time passes
        assert engine.spill_scheduler.due(engine.sessions, set()) is None
        report = wait_report(engine)
        assert report.sessions_kv["c"] > 0 and report.store_status.startswith("unavailable: ")
        assert engine.sessions["c"].cache is not None
        assert spill_now(engine, "c").state == "refused"
        msgs += [Message("assistant", d.reply), Message("user", "again")]
        d2 = expect_done(ask(engine, "c", msgs, NEW))
        assert d2.stats.reused_tokens > 0
        assert any("KV store is unavailable" in n for n in notices)
    finally:
        engine.shutdown()


def test_sliding_window_models_are_refused_with_a_reason(tiny_model, tmp_path):
    import shutil

    model = tmp_path / "m"
    shutil.copytree(tiny_model("qwen2_vl"), model)
    cfg = json.loads((model / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    text.update(
        {
            "use_sliding_window": True,
            "sliding_window": 8,
            "max_window_layers": 0,
            "layer_types": ["sliding_attention"] * text["num_hidden_layers"],
        }
    )
    (model / "config.json").write_text(json.dumps(cfg))
    engine = open_engine(model, tmp_path / "d", block_tokens=B)
    try:
        assert engine.spill_scheduler.refusal and "sliding" in engine.spill_scheduler.refusal.lower()
        expect_done(ask(engine, "c", [Message("user", "hi")], 3))
        st = spill_now(engine, "c")
        assert st.state == "refused" and "Sliding" in st.detail
        assert engine.sessions["c"].cache is not None
    finally:
        engine.shutdown()


def test_replay_restart_restores_from_the_store(tiny_model, tmp_path):
    make_picture(tmp_path / "a.png", 4)
    script = {
        "settings": {"max_new_tokens": 4, "block_tokens": B, "spill_idle_s": 3600},
        "turns": [
            {"user": "What is in this picture, in detail?", "images": ["a.png"]},
            {"user": "And after a restart?", "restart": True},
        ],
    }
    path = tmp_path / "s.json"
    path.write_text(json.dumps(script))
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "main.py"),
            "replay",
            str(path),
            "--model",
            str(tiny_model("smolvlm" if "smolvlm" in FAMILIES else "idefics3")),
            "--data-dir",
            str(tmp_path / "d"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    assert lines[1]["stats"]["restored_tokens"] > 0
    assert lines[1]["stats"]["encoder_loads"] == 0


def test_make_room_spills_idle_conversations_before_the_encoder_loads(tiny_model, tmp_path):
    """With memory short (a budget just above what is held), waking the encoder spills the
    oldest idle conversation first — never the active one — and loses nothing."""
    model = tiny_model("llava")
    ref = Reference(model)
    engine = open_engine(model, tmp_path / "d", block_tokens=B, spill_idle_s=3600, elastic_idle_s=3600)
    try:
        a, b = make_picture(tmp_path / "a.png", 1), make_picture(tmp_path / "b.png", 2)
        old = [Message("user", "An old conversation about this.", pics(a))]
        d_old = expect_done(ask(engine, "old", old, NEW))
        expect_done(ask(engine, "newer", [Message("user", "Text only chat.")], NEW))
        unloaded = threading.Event()
        engine.add_listener(lambda e: unloaded.set() if isinstance(e, EncoderState) and e.state == "unloaded" else None)
        engine.unload_encoder()
        from engine.device.ledger import model_bytes

        assert unloaded.wait(10), "the encoder was not unloaded"
        lm, _ = model_bytes(engine.loaded)
        held = lm + sum(s.kv_bytes() for s in engine.sessions.values())
        need = engine.gate.residency.weight_bytes()
        engine.update_settings(memory_budget_bytes=held + need - 1)  # one byte short of the encoder
        d = expect_done(ask(engine, "active", [Message("user", "A new picture.", pics(b))], NEW))
        assert d.stats.encoder_loads == 1
        assert engine.sessions["old"].cache is None  # the oldest idle one was spilled first
        assert engine.sessions["newer"].cache is not None  # and no more than needed
        assert engine.sessions["active"].cache is not None
        old += [Message("assistant", d_old.reply), Message("user", "Still there?")]
        back = expect_done(ask(engine, "old", old, NEW))
        assert back.stats.restored_tokens > 0 and back.token_ids == ref.reply_ids(old, NEW)
    finally:
        engine.shutdown()


def test_a_full_disk_pauses_spilling_and_loses_nothing(tiny_model, small_disk):
    model = tiny_model("llava")
    ref = Reference(model)
    data = small_disk.root / "data"
    msgs = [Message("user", "Tell me about the weather today, please.")]
    engine = open_engine(model, data, block_tokens=B, spill_idle_s=3600)
    try:
        d1 = expect_done(ask(engine, "c", msgs, NEW))
        assert spill_now(engine, "c").state == "spilled"
    finally:
        engine.shutdown()
    msgs += [Message("assistant", d1.reply), Message("user", "And tomorrow?")]

    small_disk.fill()
    notices: list[str] = []
    engine = open_engine(model, data, notices, block_tokens=B, spill_idle_s=3600)
    try:
        assert [n for n in notices if "KV store is unavailable" in n and "full" in n] != []
        d2 = expect_done(ask(engine, "c", msgs, NEW))  # the turn works: prefilled, not restored
        assert d2.token_ids == ref.reply_ids(msgs, NEW)
        refused = spill_now(engine, "c")
        assert refused.state == "refused" and "full" in refused.detail
        assert engine.sessions["c"].cache is not None  # stays hot
        assert wait_report(engine).store_status.startswith("paused:")
        small_disk.free()
        assert spill_now(engine, "c").state == "spilled"  # asked again: the store is back
        assert wait_report(engine).store_status == ""
        assert [n for n in notices if "usable again" in n] != []
    finally:
        engine.shutdown()
    assert not [n for n in os.listdir(data / "kv-store") if ".corrupt-" in n]

    msgs += [Message("assistant", d2.reply), Message("user", "Thanks!")]
    engine = open_engine(model, data, block_tokens=B, spill_idle_s=3600)
    try:
        d3 = expect_done(ask(engine, "c", msgs, NEW))
        assert d3.stats.restored_tokens > 0
        assert d3.token_ids == ref.reply_ids(msgs, NEW)
    finally:
        engine.shutdown()


@pytest.mark.parametrize("family", FAMILIES)
def test_a_restore_ending_inside_a_picture_keeps_its_whole_blocks(family, tiny_model, tmp_path):
    """The same first turn (picture + short question) in a second chat restores the first chat's
    whole blocks, the last one ending inside the picture, and prefills only the rest: the
    picture's remaining tokens get their feature rows, and the reply equals a fresh prefill's."""
    model = tiny_model(family)
    ref = Reference(model)
    msgs = [Message("user", "What is in this picture?", pics(make_picture(tmp_path / "p.png", 3)))]
    probe = open_engine(model, tmp_path / "probe", spill_idle_s=3600)
    try:
        first = expect_done(ask(probe, "a", msgs, NEW)).stats.prompt_tokens
        span = probe.sessions["a"].pictures[0]
    finally:
        probe.shutdown()
    # a block size whose last whole block (of the prompt less its last token) ends inside the picture
    block = next(b for b in range(4, first) if span.start < (first - 1) // b * b < span.end)
    engine = open_engine(model, tmp_path / "d", block_tokens=block, spill_idle_s=3600)
    try:
        expect_done(ask(engine, "a", msgs, NEW))
        assert spill_now(engine, "a").state == "spilled"
        d = expect_done(ask(engine, "b", msgs, NEW))  # another chat, the same opening: shared blocks
        whole = (first - 1) // block * block
        assert d.stats.restored_tokens == whole, (block, span, d.stats)  # not backed off to the picture's start
        assert d.stats.prefill_tokens == first - whole
        assert d.token_ids == ref.reply_ids(msgs, NEW)
    finally:
        engine.shutdown()
