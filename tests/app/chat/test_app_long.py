"""A long conversation (600 messages) opens at its end and scrolls without per-message widgets."""

from __future__ import annotations

from PySide6.QtWidgets import QWidget


def fill(history, n: int) -> str:
    conv = history.create_conversation("Long one")
    for i in range(n // 2):
        history.add_message(conv.id, "user", f"Question {i}: what about the **shape**?")
        history.add_message(
            conv.id, "assistant", f"Answer {i}.\n\n```python\nprint({i})\n```\n\n- one\n- two\n\n" + "word " * (i % 40)
        )
    return conv.id


def test_six_hundred_messages_open_at_the_end_and_scroll(make_window, qtbot, tmp_path):
    w = make_window(load=False)
    widgets_before = len(w.chat.findChildren(QWidget))
    cid = fill(w.history, 600)
    w.sidebar.refresh()
    w.controller.open_conversation(cid)
    qtbot.waitUntil(lambda: w.chat.verticalScrollBar().maximum() > 10_000, timeout=10000)
    bar = w.chat.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.value() == bar.maximum(), timeout=5000)
    last = w.messages.index(599, 0)
    assert w.chat.viewport().rect().intersects(w.chat.visualRect(last))
    # one view for all rows: no widget per message
    assert len(w.chat.findChildren(QWidget)) == widgets_before

    # each scroll step paints the rows in view, not the chat: what keeps a step cheap at any length
    # (the step's time is tests/bench/ui_stall.py's to measure, not the suite's)
    painted: list[int] = []
    paint = w.chat.delegate.paint
    w.chat.delegate.paint = lambda painter, option, index: (painted.append(index.row()), paint(painter, option, index))
    step = w.chat.viewport().height() // 2
    value = bar.maximum()
    while value > 0:
        value = max(0, value - step)
        bar.setValue(value)
        painted.clear()
        w.chat.viewport().grab()  # forces a real paint of the visible rows
        shown = [
            r for r in range(600) if w.chat.visualRect(w.messages.index(r, 0)).intersects(w.chat.viewport().rect())
        ]
        assert painted and set(painted) <= set(shown), (painted, shown)
    assert w.chat.viewport().rect().intersects(w.chat.visualRect(w.messages.index(0, 0)))


def test_scrolled_up_reader_is_not_pulled_down_by_a_stream(make_window, qtbot):
    w = make_window(max_new_tokens=200)
    cid = fill(w.history, 60)
    w.controller.open_conversation(cid)
    bar = w.chat.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum(), timeout=5000)
    bar.setValue(bar.maximum() // 3)
    kept = bar.value()
    w.composer.edit.setPlainText("one more")
    w.composer.submit()
    qtbot.waitUntil(lambda: not w.controller.is_generating(), timeout=60000)
    assert bar.value() == kept
    bar.setValue(bar.maximum())  # back at the end, it follows again
    w.composer.edit.setPlainText("and another")
    w.composer.submit()
    qtbot.waitUntil(lambda: not w.controller.is_generating(), timeout=60000)
    qtbot.waitUntil(lambda: bar.value() == bar.maximum(), timeout=5000)
