"""A conversation opens at its latest message, and a reply sent there stays in view while it
streams — unless the person scrolled up to read, which the view then leaves alone."""

from __future__ import annotations

from tests.helpers.window import send, wait_reply

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
    from app.history.history import History

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


def test_reply_text_is_selected_by_dragging_and_double_clicking(make_window, qtbot):
    """Issue 40: a reply's text could not be selected with the mouse; only Copy of the whole message."""
    from PySide6.QtCore import QPoint, QPointF, Qt
    from PySide6.QtGui import QGuiApplication, QTextCursor

    w = make_window(load=False)
    conv = w.history.create_conversation("Shapes")
    w.history.add_message(conv.id, "user", "What is in the picture?")
    reply = "A red circle sits at the top left.\n\nA blue square fills the right side."
    w.history.add_message(conv.id, "assistant", reply)
    w.controller.open_conversation(conv.id)
    w.resize(1000, 700)
    qtbot.waitUntil(lambda: w.messages.rowCount() == 2)
    view, delegate = w.chat, w.chat.delegate
    QGuiApplication.processEvents()
    index = w.messages.index(1)
    rect = view.visualRect(index)
    geo = delegate.geometry(index)
    layout = geo.doc.documentLayout()

    def at(position: int) -> QPoint:  # where character `position` of the reply is drawn, in the viewport
        cursor = QTextCursor(geo.doc)
        cursor.setPosition(position)
        block = cursor.block()
        line = block.layout().lineForTextPosition(position - block.position())
        x = line.cursorToX(position - block.position())[0] + block.layout().position().x()
        y = line.y() + line.height() / 2 + block.layout().position().y()
        return (geo.doc_origin + QPointF(x, y)).toPoint() + rect.topLeft()

    assert (
        layout.hitTest(type(geo.doc_origin)(at(2) - rect.topLeft()) - geo.doc_origin, Qt.HitTestAccuracy.FuzzyHit) == 2
    )
    # a drag from "red" to the end of "circle" selects those words
    start, end = reply.index("red"), reply.index("circle") + len("circle")
    qtbot.mousePress(view.viewport(), Qt.MouseButton.LeftButton, pos=at(start))
    qtbot.mouseMove(view.viewport(), at(start + 3))
    qtbot.mouseMove(view.viewport(), at(end))
    qtbot.mouseRelease(view.viewport(), Qt.MouseButton.LeftButton, pos=at(end))
    assert delegate.selected_text() == "red circle"
    view.setFocus()
    qtbot.keyClick(view, Qt.Key.Key_C, Qt.KeyboardModifier.ControlModifier)
    assert QGuiApplication.clipboard().text() == "red circle"

    # a double-click selects the word under it
    square = reply.index("square") + 2
    qtbot.mouseDClick(view.viewport(), Qt.MouseButton.LeftButton, pos=at(square))
    assert delegate.selected_text() == "square"

    # a plain click elsewhere clears it, and Copy still copies the whole message
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=at(5))
    assert delegate.selected_text() == ""
