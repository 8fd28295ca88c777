"""A conversation opens at its latest message, and a reply sent there stays in view while it
streams — unless the person scrolled up to read, which the view then leaves alone."""

from __future__ import annotations

from tests.test_app_support import make_window, send, wait_reply  # noqa: F401

LONG = "A long paragraph about the picture, going on and on so that it wraps several times. " * 6


def fill(history, title: str, rounds: int = 12) -> str:
    cid = history.create_conversation(title).id
    for i in range(rounds):
        history.add_message(cid, "user", f"question {i}: {LONG}")
        history.add_message(cid, "assistant", f"answer {i}: {LONG}")
    return cid


def at_bottom(view) -> bool:
    bar = view.verticalScrollBar()
    return bar.maximum() > 0 and bar.value() == bar.maximum()


def test_opening_a_conversation_shows_its_latest_message_and_follows_the_reply(make_window, qtbot):
    w = make_window(max_new_tokens=12)
    first, second = fill(w.history, "first"), fill(w.history, "second")
    w.controller.open_conversation(first)
    qtbot.waitUntil(lambda: at_bottom(w.chat), timeout=5000)
    w.controller.open_conversation(second)
    qtbot.waitUntil(lambda: at_bottom(w.chat), timeout=5000)
    send(qtbot, w, "one more question")
    wait_reply(qtbot, w)
    qtbot.waitUntil(lambda: at_bottom(w.chat), timeout=5000)
    last = w.chat.msg_model.index(w.chat.msg_model.rowCount() - 1, 0)
    assert w.chat.viewport().rect().intersects(w.chat.visualRect(last))  # the reply is on screen


def test_a_reader_scrolled_up_is_left_where_they_are(make_window, qtbot):
    w = make_window(max_new_tokens=12)
    w.controller.open_conversation(fill(w.history, "long"))
    qtbot.waitUntil(lambda: at_bottom(w.chat), timeout=5000)
    bar = w.chat.verticalScrollBar()
    bar.setValue(bar.maximum() // 3)
    kept = bar.value()
    send(qtbot, w, "another one")
    wait_reply(qtbot, w)
    assert bar.value() == kept


def test_the_conversation_open_at_start_shows_its_latest_message(make_window, qtbot, tmp_path):
    from app.history import History

    data = tmp_path / "data"
    fill(History(data), "from last time")
    w = make_window(data_dir=data, max_new_tokens=12)
    qtbot.waitUntil(lambda: at_bottom(w.chat), timeout=5000)
    send(qtbot, w, "and now?")
    wait_reply(qtbot, w)
    qtbot.waitUntil(lambda: at_bottom(w.chat), timeout=5000)


def test_clicking_a_conversation_in_the_sidebar_shows_its_latest_message(make_window, qtbot):
    from PySide6.QtCore import Qt

    w = make_window(max_new_tokens=12)
    cid = fill(w.history, "older")
    w.sidebar.refresh()
    w.controller.new_conversation()
    qtbot.waitUntil(lambda: w.chat.msg_model.rowCount() == 0, timeout=5000)
    row = w.sidebar.model.row_of(cid)
    rect = w.sidebar.list.visualRect(w.sidebar.model.index(row, 0))
    qtbot.mouseClick(w.sidebar.list.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    qtbot.waitUntil(lambda: w.chat.msg_model.rowCount() == 24, timeout=5000)
    qtbot.waitUntil(lambda: at_bottom(w.chat), timeout=5000)
