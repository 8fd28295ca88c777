"""Versions of a chat through the engine (#41): leaving a version keeps its KV as a version row
that writes only the blocks the store lacks; switching back restores that version past the hot
opening, never encodes a picture again, and replies exactly as a fresh prefill of that version's
history would, also after a restart."""

from __future__ import annotations

import math
import threading

import pytest

from engine.kvstore import is_version
from engine.pictures.span import pictures_agree
from engine.protocol.events import ChatMemoryReport, KVPlace, Message
from tests.fixtures.pictures import make_picture, pics
from tests.helpers.engine_helpers import Reference, ask, expect_done, open_engine, spill_now, wait_report

NEW = 6
B = 16  # small blocks so tiny conversations span several
FAMILIES = ["llava", "qwen2_vl"]
pytestmark = pytest.mark.slow


def turn(engine, messages: list[Message]):
    """A turn, then a memory report: the report is made after the turn's version writes are
    committed, so the store's rows and counters are settled when it arrives."""
    done = expect_done(ask(engine, "c", messages, NEW))
    wait_report(engine)
    return done


def versions_of(engine, cid: str = "c") -> list[str]:
    store = engine.spill_scheduler.store
    return sorted(s for s in store.sessions() if is_version(s) and s.startswith(cid + "#"))


def blocks_written(engine) -> int:
    c = engine.spill_scheduler.store.counters
    return c["blocks_written"] + c["tails_written"]


def held(engine, cid: str = "c") -> tuple[list[int], tuple]:
    session = engine.sessions[cid]
    return list(session.ids), session.pictures


def differing(mine: tuple[list[int], tuple], other: tuple[list[int], tuple]) -> int:
    """Tokens of `mine` past the point where it differs from `other` (a picture's tokens are all
    the same id: its key tells two pictures apart)."""
    (a, a_pics), (b, b_pics) = mine, other
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return len(a) - pictures_agree(0, n, a_pics, b_pics)


class Chat:
    """Two versions of a chat's second question, each with its reply and a follow-up."""

    def __init__(self, tmp_path):
        self.a = make_picture(tmp_path / "a.png", 1)
        self.b = make_picture(tmp_path / "b.png", 2, size=(64, 40))
        self.c = make_picture(tmp_path / "c.png", 3, size=(48, 56))
        self.u1 = Message("user", "Describe the first picture in a few words, please.", pics(self.a))
        self.u2 = Message("user", "Now compare it with this one, at some length.", pics(self.b))
        self.u2_edit = Message("user", "No, tell me instead what this one shows.", pics(self.c))
        self.u3 = Message("user", "Which has more red in it?")


@pytest.mark.parametrize("family", FAMILIES)
def test_switching_versions_restores_exactly_and_encodes_nothing(family, tiny_model, tmp_path):
    model = tiny_model(family)
    ref = Reference(model)
    chat = Chat(tmp_path)
    engine = open_engine(model, tmp_path / "data", block_tokens=B, spill_idle_s=3600)
    marks: list[ChatMemoryReport] = []
    engine.add_listener(lambda e: marks.append(e) if isinstance(e, ChatMemoryReport) else None)
    try:
        d1 = turn(engine, [chat.u1])
        first = [chat.u1, Message("assistant", d1.reply)]
        version_a = first + [chat.u2]
        a2 = turn(engine, version_a)
        assert a2.token_ids == ref.reply_ids(version_a, NEW)
        assert versions_of(engine) == []  # going on is no version
        a_held = held(engine)

        # the edit leaves version A: its KV becomes a version row (nothing was stored before, so
        # its opening is written with it), and the edited turn reuses the hot opening
        version_b = first + [chat.u2_edit]
        b2 = turn(engine, version_b)
        assert b2.token_ids == ref.reply_ids(version_b, NEW)
        assert b2.stats.reused_tokens > 0 and b2.stats.restored_tokens == 0
        assert len(versions_of(engine)) == 1

        # back to A with a follow-up: B is kept (only its own blocks written), A is restored past
        # the hot opening, and no picture is encoded again
        written = blocks_written(engine)
        b_held = held(engine)
        follow_a = version_a + [Message("assistant", a2.reply), chat.u3]
        d = turn(engine, follow_a)
        assert d.token_ids == ref.reply_ids(follow_a, NEW)
        s = d.stats
        assert s.restored_tokens > 0 and s.reused_tokens > 0, s
        assert s.prefill_tokens == s.prompt_tokens - s.reused_tokens - s.restored_tokens
        assert s.pictures_encoded == 0 and s.encoder_loads == 0
        assert blocks_written(engine) - written <= math.ceil(differing(b_held, a_held) / B) + 1
        assert len(versions_of(engine)) == 2

        # and to B again, with its own follow-up: restored from B's row
        follow_b = version_b + [Message("assistant", b2.reply), chat.u3]
        d = turn(engine, follow_b)
        assert d.token_ids == ref.reply_ids(follow_b, NEW)
        assert d.stats.restored_tokens > 0 and d.stats.pictures_encoded == 0
        # the chat's memory marks name the chat only, never its versions
        assert spill_now(engine, "c").state == "spilled"
        wait_report(engine)  # the marks are published before the report that follows them
        assert marks and marks[-1].of("c").place == KVPlace.ON_SSD
        assert all(not is_version(m.conversation_id) for r in marks for m in r.chats)
    finally:
        engine.shutdown()


@pytest.mark.parametrize("family", FAMILIES)
def test_versions_after_a_spill_and_a_restart(family, tiny_model, tmp_path):
    model = tiny_model(family)
    ref = Reference(model)
    chat = Chat(tmp_path)
    data = tmp_path / "data"
    engine = open_engine(model, data, block_tokens=B, spill_idle_s=3600)
    try:
        d1 = turn(engine, [chat.u1])
        first = [chat.u1, Message("assistant", d1.reply)]
        version_a = first + [chat.u2]
        a2 = turn(engine, version_a)
        a_held = held(engine)
        assert spill_now(engine, "c").state == "spilled"  # A is the chat's row on the SSD

        # a cold edit: A's row is kept as a version (no blob written), B restores the opening
        written = blocks_written(engine)
        version_b = first + [chat.u2_edit]
        b2 = turn(engine, version_b)
        assert b2.token_ids == ref.reply_ids(version_b, NEW)
        assert b2.stats.restored_tokens > 0
        assert blocks_written(engine) == written and len(versions_of(engine)) == 1

        # B's spill writes only its own blocks: the opening it shares with A is there
        b_held = held(engine)
        assert spill_now(engine, "c").state == "spilled"
        assert blocks_written(engine) - written <= math.ceil(differing(b_held, a_held) / B) + 1
    finally:
        engine.shutdown()

    engine = open_engine(model, data, block_tokens=B, spill_idle_s=3600)
    try:
        # after the restart, back to A: restored from its version row, pictures from the disk cache
        follow_a = version_a + [Message("assistant", a2.reply), chat.u3]
        d = turn(engine, follow_a)
        assert d.token_ids == ref.reply_ids(follow_a, NEW)
        assert d.stats.restored_tokens > 0 and d.stats.reused_tokens == 0
        assert d.stats.pictures_encoded == 0 and d.stats.encoder_loads == 0
        # and B, hot-switched from A: restored past the hot opening
        follow_b = version_b + [Message("assistant", b2.reply), chat.u3]
        d = turn(engine, follow_b)
        assert d.token_ids == ref.reply_ids(follow_b, NEW)
        assert d.stats.restored_tokens > 0 and d.stats.pictures_encoded == 0
    finally:
        engine.shutdown()


class Marks:
    """The engine's latest word on where each chat's KV is (ChatMemoryReport), waited on."""

    def __init__(self, engine):
        self.last: ChatMemoryReport | None = None
        self._cv = threading.Condition()
        engine.add_listener(self._on)

    def _on(self, ev) -> None:
        if isinstance(ev, ChatMemoryReport):
            with self._cv:
                self.last = ev
                self._cv.notify_all()

    def wait(self, cid: str, place: KVPlace, timeout: float = 60.0) -> None:
        with self._cv:
            assert self._cv.wait_for(lambda: self.last is not None and self.last.of(cid).place == place, timeout)


def test_a_switch_after_the_chat_was_restored_ahead(tiny_model, tmp_path):
    """After a restart, opening the chat restores its row (the version last shown) before any
    turn; a turn of the other version then keeps that one (its blocks are all stored: nothing
    written) and restores its own past the opening they share."""
    model = tiny_model("qwen2_vl")
    ref = Reference(model)
    chat = Chat(tmp_path)
    data = tmp_path / "data"
    engine = open_engine(model, data, block_tokens=B, spill_idle_s=3600)
    try:
        d1 = turn(engine, [chat.u1])
        first = [chat.u1, Message("assistant", d1.reply)]
        version_a = first + [chat.u2]
        a2 = turn(engine, version_a)
        version_b = first + [chat.u2_edit]
        turn(engine, version_b)  # leaves A; exit spills B as the chat's row
    finally:
        engine.shutdown()
    engine = open_engine(model, data, block_tokens=B, spill_idle_s=3600)
    marks = Marks(engine)
    try:
        engine.open_chat("c")
        marks.wait("c", KVPlace.HOT)  # B, restored ahead
        written = blocks_written(engine)
        follow_a = version_a + [Message("assistant", a2.reply), chat.u3]
        d = turn(engine, follow_a)
        assert d.token_ids == ref.reply_ids(follow_a, NEW)
        assert d.stats.reused_tokens > 0 and d.stats.restored_tokens > 0, d.stats
        assert d.stats.pictures_encoded == 0
        assert blocks_written(engine) == written  # B's blocks were all stored
        assert len(versions_of(engine)) == 2  # A, and B as it was restored
    finally:
        engine.shutdown()
