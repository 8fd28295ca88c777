"""Opening a chat whose KV is on the SSD restores it before any turn is sent (after a restart
too), step by step on the owner thread; a turn sent mid-restore finishes it and is exact; switching
away, a turn of another chat and short memory each stop it or keep it from starting; and the
engine says where each chat's KV is (ChatMemoryReport) with estimates from measured rates."""

from __future__ import annotations

import threading

import pytest

import engine.local.resume_ahead as resume_ahead
from engine.protocol.events import ChatMemoryReport, KVPlace, Message
from tests.fixtures.pictures import make_picture, pics
from tests.helpers.engine_helpers import Reference, ask, expect_done, open_engine

NEW = 6
B = 16  # small blocks: a tiny conversation spans several, so a restore has steps
pytestmark = pytest.mark.slow


class Places:
    """Every ChatMemoryReport the engine sends, and a wait for a condition on the latest."""

    def __init__(self, engine):
        self.reports: list[ChatMemoryReport] = []
        self._cv = threading.Condition()
        engine.add_listener(self._on)

    def _on(self, ev) -> None:
        if isinstance(ev, ChatMemoryReport):
            with self._cv:
                self.reports.append(ev)
                self._cv.notify_all()

    def history(self, cid: str) -> list[KVPlace]:
        out = []
        for r in self.reports:
            p = r.of(cid).place
            if not out or out[-1] != p:
                out.append(p)
        return out

    def wait(self, predicate, timeout: float = 30.0) -> ChatMemoryReport:
        with self._cv:
            ok = self._cv.wait_for(lambda: self.reports and predicate(self.reports[-1]), timeout)
            assert ok, (
                f"no such report; last: {self.reports[-1] if self.reports else None}; places of c: {self.history('c')}"
            )
            return self.reports[-1]


def two_turns(engine, tmp_path, cid="c") -> list[Message]:
    pic = make_picture(tmp_path / "a.png", 1)
    msgs = [Message("user", "Describe the first picture in a few words, please.", pics(pic))]
    d = expect_done(ask(engine, cid, msgs, NEW))
    msgs += [Message("assistant", d.reply), Message("user", "And what colour is it mostly? Say it briefly.")]
    d = expect_done(ask(engine, cid, msgs, NEW))
    msgs += [Message("assistant", d.reply), Message("user", "One more word about it.")]
    return msgs


@pytest.fixture
def spilled_chat(tiny_model, tmp_path):
    """A qwen2_vl chat of two turns, spilled by the engine's exit; (model folder, data folder, the
    next turn's messages)."""
    model = tiny_model("qwen2_vl")
    data = tmp_path / "data"
    engine = open_engine(model, data, block_tokens=B, spill_idle_s=3600)
    try:
        msgs = two_turns(engine, tmp_path)
    finally:
        engine.shutdown()
    return model, data, msgs


def test_opening_a_spilled_chat_after_a_restart_restores_it_before_the_turn(spilled_chat):
    model, data, msgs = spilled_chat
    ref = Reference(model)
    engine = open_engine(model, data, block_tokens=B, spill_idle_s=3600)
    places = Places(engine)
    try:
        engine.request_memory_report()
        before = places.wait(lambda r: r.of("c").place == KVPlace.ON_SSD)
        chat = before.of("c")
        # the store says what it holds after the restart; the estimates are measured, not constants
        assert chat.tokens > 2 * B and chat.kv_bytes > 0
        assert before.rates.restore_mib_s and before.rates.prefill_tok_s  # a probe read and the last run's prefill
        assert chat.resume_s == pytest.approx(chat.kv_bytes / (before.rates.restore_mib_s * (1 << 20)))
        assert chat.reread_s == pytest.approx(chat.tokens / before.rates.prefill_tok_s)

        engine.open_chat("c")
        hot = places.wait(lambda r: r.of("c").place == KVPlace.HOT)
        assert places.history("c") == [KVPlace.ON_SSD, KVPlace.RESTORING, KVPlace.HOT]
        assert hot.of("c").tokens == chat.tokens
        assert engine.sessions["c"].cached_tokens == chat.tokens  # in memory before any turn was sent

        d = expect_done(ask(engine, "c", msgs, NEW))
        s = d.stats
        assert d.token_ids == ref.reply_ids(msgs, NEW)  # exact against a fresh full prefill
        # the turn says where its opening came from: the SSD, restored ahead (never "reused 0" alone)
        assert s.restored_tokens > 2 * B and s.reused_tokens == 0 and s.restore_ahead_s > 0 and s.restore_s == 0
        assert s.prefill_tokens == s.prompt_tokens - s.restored_tokens
        assert s.reread_estimate_s and s.first_token_s >= s.prefill_s
    finally:
        engine.shutdown()


def test_a_turn_sent_mid_restore_finishes_it_and_is_exact(spilled_chat, monkeypatch):
    model, data, msgs = spilled_chat
    ref = Reference(model)
    monkeypatch.setattr(resume_ahead, "PROGRESS_EVERY_S", 0.0)  # say progress after every blob
    engine = open_engine(model, data, block_tokens=B, spill_idle_s=3600)
    places = Places(engine)
    sent: dict = {}
    started = threading.Event()

    def send_mid_restore(ev):  # on the owner thread, between two blobs: the turn waits in the queue
        if (
            isinstance(ev, ChatMemoryReport)
            and ev.of("c").place == KVPlace.RESTORING
            and ev.of("c").restored_tokens >= B
            and not started.is_set()
        ):
            sent["thread"] = threading.Thread(target=lambda: sent.setdefault("done", ask(engine, "c", msgs, NEW)))
            sent["thread"].start()
            started.set()

    engine.add_listener(send_mid_restore)
    try:
        engine.open_chat("c")
        assert started.wait(60)
        sent["thread"].join(60)
        d = expect_done(sent["done"])
        restoring = [r.of("c") for r in places.reports if r.of("c").place == KVPlace.RESTORING]
        assert restoring[-1].restored_tokens < restoring[-1].tokens  # the turn came in before the end
        assert d.token_ids == ref.reply_ids(msgs, NEW)
        s = d.stats
        assert s.restored_tokens > 2 * B and s.reused_tokens == 0
        assert s.restore_ahead_s > 0 and s.restore_s > 0  # part before the turn, the rest in it
        assert engine.spill_scheduler.store.counters["restores"] == 1  # the blobs were read once
    finally:
        engine.shutdown()


def test_switching_away_or_another_chats_turn_stops_the_restore(spilled_chat, tmp_path):
    model, data, msgs = spilled_chat
    engine = open_engine(model, data, block_tokens=B, spill_idle_s=3600)
    places = Places(engine)

    def switch_away(ev):
        if isinstance(ev, ChatMemoryReport) and ev.of("c").place == KVPlace.RESTORING:
            engine.remove_listener(switch_away)
            engine.open_chat("other")

    engine.add_listener(switch_away)
    try:
        engine.open_chat("c")
        places.wait(lambda r: places.history("c")[-2:] == [KVPlace.RESTORING, KVPlace.ON_SSD])
        assert "c" not in engine.sessions or engine.sessions["c"].cache is None
        assert engine.spill_scheduler.store.counters["restores"] == 0  # a cancelled restore is no restore

        # back to the chat: a turn of another chat cancels its restore; it begins again afterwards
        other: dict = {}

        def other_turn(ev):
            if isinstance(ev, ChatMemoryReport) and ev.of("c").place == KVPlace.RESTORING:
                engine.remove_listener(other_turn)
                other["thread"] = threading.Thread(
                    target=lambda: other.setdefault("done", ask(engine, "x", [Message("user", "Hello there.")], 2))
                )
                other["thread"].start()

        engine.add_listener(other_turn)
        engine.open_chat("c")
        places.wait(lambda r: r.of("c").place == KVPlace.HOT and r.of("x").place == KVPlace.HOT)
        other["thread"].join(60)
        expect_done(other["done"])
        assert places.history("c")[-4:] == [KVPlace.RESTORING, KVPlace.ON_SSD, KVPlace.RESTORING, KVPlace.HOT]
    finally:
        engine.shutdown()


def test_no_restore_ahead_that_memory_cannot_hold(spilled_chat):
    model, data, msgs = spilled_chat
    ref = Reference(model)
    probe = open_engine(model, data, block_tokens=B, spill_idle_s=3600)
    from engine.device.ledger import model_bytes

    weights, fmt = model_bytes(probe.loaded)[0], probe.loaded.weights  # the language model's
    probe.shutdown()
    # a budget that holds the model and nothing more: the chat's KV would not fit (the same
    # weight format, which a budget could otherwise change, and with it the store's namespace)
    engine = open_engine(
        model, data, block_tokens=B, spill_idle_s=3600, memory_budget_bytes=weights + 1024, weights=fmt
    )
    places = Places(engine)
    try:
        engine.open_chat("c")
        held = places.wait(lambda r: r.of("c").held_back != "")
        assert held.of("c").place == KVPlace.ON_SSD and held.of("c").held_back.startswith("memory is short (")
        assert KVPlace.RESTORING not in places.history("c")
        d = expect_done(ask(engine, "c", msgs, NEW))  # the turn itself still restores (its own choice)
        assert d.token_ids == ref.reply_ids(msgs, NEW)
    finally:
        engine.shutdown()
