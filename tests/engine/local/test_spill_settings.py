"""Spill settings changed while the engine runs take effect at once, as the Settings dialog
promises: the idle time before a conversation spills, and the KV store's size cap (with the
free-space floor that follows from it). Both were read once, when the store opened, so a change
was silently ignored until the next start."""

from __future__ import annotations

import threading

import pytest

from engine.kvstore.store import default_floor
from engine.protocol.events import Message, SpillState
from tests.helpers.engine_helpers import ask, expect_done, open_engine, spill_now, wait_report

NEW = 4
B = 16  # small blocks: a short conversation fills several
pytestmark = pytest.mark.slow


def _say(engine, cid: str, text: str) -> None:
    expect_done(ask(engine, cid, [Message("user", text)], NEW))


def test_a_shorter_idle_time_spills_without_a_restart(tiny_model, tmp_path):
    engine = open_engine(tiny_model("qwen2_vl"), tmp_path / "d", block_tokens=B, spill_idle_s=3600)
    spilled = threading.Event()
    engine.add_listener(lambda e: spilled.set() if isinstance(e, SpillState) and e.state == "spilled" else None)
    try:
        _say(engine, "c", "Tell me something about the weather in spring, please.")
        engine.update_settings(spill_idle_s=0.2)  # as the Settings dialog sends it
        assert spilled.wait(30), "the new idle time was ignored"
        assert engine.sessions["c"].cache is None
    finally:
        engine.shutdown()


def test_a_lower_store_cap_evicts_now_and_holds_for_later_spills(tiny_model, tmp_path):
    engine = open_engine(tiny_model("qwen2_vl"), tmp_path / "d", block_tokens=B, spill_idle_s=3600)
    try:
        _say(engine, "a", "The first conversation talks about boats and the sea for a while.")
        assert spill_now(engine, "a").state == "spilled"
        one = wait_report(engine).store.bytes_on_disk
        _say(engine, "b", "A second conversation, about mountains, snow and long walks uphill.")
        assert spill_now(engine, "b").state == "spilled"
        assert wait_report(engine).store.sessions == 2

        cap = one + one // 2  # room for one conversation, not two
        engine.update_settings(store_cap_bytes=cap)
        report = wait_report(engine, lambda r: r.store is not None and r.store.sessions == 1)
        assert report.store.bytes_on_disk <= cap and report.store.evicted_sessions == 1
        store = engine.spill_scheduler.store
        assert store is not None and store.max_bytes == cap and store.min_free_bytes == default_floor(cap)

        # a later spill keeps to the new cap too
        _say(engine, "c", "A third one: cooking rice, beans and a little soup on a cold evening.")
        assert spill_now(engine, "c").state == "spilled"
        assert wait_report(engine).store.bytes_on_disk <= cap

        engine.update_settings(store_cap_bytes=None)  # back to "automatic": the store's own rule
        _say(engine, "d", "And a fourth.")  # requests run in order: the change was handled before it
        assert store.max_bytes > cap
    finally:
        engine.shutdown()
