"""The bridge: engine events reach the UI thread in order, with tokens coalesced."""

from __future__ import annotations

import threading

from PySide6.QtCore import QThread

import app  # noqa: F401  (PySide6 refcount workaround)
from app.connection.bridge import EngineBridge
from engine.protocol.events import Message, Sampling, Turn


def test_tokens_are_coalesced_and_ordered(qtbot, tmp_path, tiny_model):
    bridge = EngineBridge.create(data_dir=tmp_path / "data")
    try:
        with qtbot.waitSignal(bridge.modelReady, timeout=60000):
            bridge.load_model(str(tiny_model("llava")))
        log: list[tuple] = []
        threads = set()
        bridge.turnStarted.connect(lambda ev: log.append(("started", ev.turn_id)))
        bridge.tokens.connect(
            lambda tid, cid, text, n: (log.append(("tokens", tid, text, n)), threads.add(QThread.currentThread()))
        )
        bridge.turnDone.connect(lambda ev: log.append(("done", ev.turn_id, ev)))
        turn = Turn(
            "c1", [Message("user", "Describe the picture in detail.")], Sampling(greedy=True, max_new_tokens=400)
        )
        with qtbot.waitSignal(bridge.turnDone, timeout=60000):
            tid = bridge.submit(turn)
        assert log[0] == ("started", tid) and log[-1][:2] == ("done", tid)
        chunks = [e for e in log if e[0] == "tokens"]
        done = log[-1][2]
        assert sum(e[3] for e in chunks) == len(done.token_ids) == 400
        assert "".join(e[2] for e in chunks) == done.reply
        assert len(chunks) < 400 / 4  # merged: far fewer deliveries than tokens
        assert threads == {QThread.currentThread()}  # delivered on the UI thread
    finally:
        bridge.shutdown()


def test_events_after_shutdown_are_dropped(qtbot, tmp_path):
    bridge = EngineBridge.create(data_dir=tmp_path / "data")
    got = []
    bridge.notice.connect(got.append)
    bridge.shutdown()
    from engine.protocol.events import Notice

    t = threading.Thread(target=bridge.inject, args=(Notice("info", "late"),))
    t.start()
    t.join()
    qtbot.wait(100)
    assert got == []


def test_many_signal_emits_do_not_exhaust_a_refcount():
    """PySide6 6.12 on Python 3.11 drops a reference to True per emit; without the workaround in
    app/pyside_refcount_fix.py this aborts the process long before 50,000 emits."""
    from app import pyside_refcount_fix

    assert pyside_refcount_fix.self_test(50_000)
