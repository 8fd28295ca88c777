"""A damaged history database never stops the window: it opens, says what happened and where
the damaged copy is, and the new history works."""

from __future__ import annotations

from PySide6.QtWidgets import QMessageBox

from app.history.history_db import DAMAGED_SUFFIX
from tests.helpers.window import send, wait_reply


def test_garbage_history_opens_the_window_with_the_message(make_window, qtbot, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "history.sqlite3").write_bytes(b"\x00garbage, not SQLite\xff" * 500)
    w = make_window(data_dir=data, max_new_tokens=4)
    box = w.history_problem
    assert isinstance(box, QMessageBox)
    qtbot.waitUntil(box.isVisible, timeout=5000)
    kept = data / ("history.sqlite3" + DAMAGED_SUFFIX)
    assert kept.exists() and str(kept) in box.text() and "damaged" in box.text()
    box.accept()
    send(qtbot, w, "hello after the damage")
    wait_reply(qtbot, w)
    convs = w.history.list_conversations()
    assert len(convs) == 1
    texts = [(m.role, m.text) for m in w.history.messages(convs[0].id)]
    assert texts[0] == ("user", "hello after the damage") and texts[1][0] == "assistant"


def test_healthy_history_shows_no_message(make_window):
    w = make_window(load=False)
    assert w.history_problem is None
