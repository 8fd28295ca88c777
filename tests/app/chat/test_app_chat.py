"""The window with a real engine and a tiny model: send, stream, stop, regenerate, edit, restart."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication

from app.history.history import COMPLETE, INTERRUPTED
from tests.fixtures.pictures import make_picture
from tests.helpers.window import click_action, send, wait_reply

TIMEOUT_MS = 60_000


def _texts(w):
    return [(it.role, it.text) for it in w.messages.items()]


def test_send_streams_a_reply_and_saves_it(make_window, qtbot, tmp_path):
    w = make_window(max_new_tokens=160)
    pic = make_picture(tmp_path / "shapes.png", seed=3)
    w.composer.take_files([str(pic)])
    seen_lengths = []
    w.messages.textGrew.connect(lambda row: seen_lengths.append(len(w.messages.item(row).text)))
    done = []
    w.bridge.turnDone.connect(done.append)
    send(qtbot, w, "What is in this picture?")
    assert w.controller.is_generating()
    assert w.composer.text() == "" and w.composer.attachments() == []
    wait_reply(qtbot, w)

    user, reply = w.messages.items()
    assert (user.role, user.text, len(user.pictures)) == ("user", "What is in this picture?", 1)
    assert reply.role == "assistant" and not reply.streaming and reply.status == COMPLETE
    assert reply.text == done[0].reply and len(done[0].token_ids) == 160
    # it streamed: the reply grew over several deliveries, not in one piece at the end
    growth = sorted(set(n for n in seen_lengths if 0 < n < len(reply.text)))
    assert len(growth) >= 2
    # history has both, complete, and the picture copied into the data dir
    stored = w.history.messages(w.controller.current_id)
    assert [(m.role, m.status) for m in stored] == [("user", COMPLETE), ("assistant", COMPLETE)]
    assert stored[1].text == reply.text
    assert w.history.picture_path(stored[0].pictures[0]).read_bytes() == pic.read_bytes()
    # the sidebar shows the conversation, titled after its first question
    assert [r.title for r in w.sidebar.model.rows] == ["What is in this picture?"]
    assert "tok/s" in w.status.speed_label.text()


def test_shift_enter_makes_a_new_line(make_window, qtbot):
    w = make_window(load=False)
    w.composer.edit.setFocus()
    qtbot.keyClicks(w.composer.edit, "one")
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(w.composer.edit, "two")
    assert w.composer.text() == "one\ntwo"
    assert w.messages.rowCount() == 0


def test_stop_with_escape_keeps_the_partial_reply(make_window, qtbot):
    w = make_window(max_new_tokens=1500)
    done = []
    w.bridge.turnDone.connect(done.append)
    send(qtbot, w, "Describe the picture in detail.")
    qtbot.waitUntil(lambda: len(w.messages.items()[-1].text) > 20, timeout=TIMEOUT_MS)
    w.composer.edit.setFocus()
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Escape)  # Esc works where the user types
    wait_reply(qtbot, w)
    reply = w.messages.items()[-1]
    assert reply.status == INTERRUPTED and not reply.streaming and reply.text
    stored = w.history.messages(w.controller.current_id)[-1]
    assert (stored.status, stored.text) == (INTERRUPTED, reply.text)
    assert done[0].stopped and len(done[0].token_ids) < 1500


def test_regenerate_adds_a_version_of_the_last_reply(make_window, qtbot):
    w = make_window(max_new_tokens=24)
    send(qtbot, w, "How many people can you see?")
    wait_reply(qtbot, w)
    first = w.messages.items()[-1]
    click_action(qtbot, w, first.id, "regenerate")
    assert w.controller.is_generating()
    wait_reply(qtbot, w)
    items = w.messages.items()
    assert len(items) == 2 and items[-1].id != first.id
    assert items[-1].text == first.text  # greedy: the same words again
    assert items[-1].versions == (2, 2)
    stored = w.history.messages(w.controller.current_id)
    assert [m.id for m in stored] == [items[0].id, items[1].id]
    click_action(qtbot, w, items[-1].id, "older")
    assert [i.id for i in w.messages.items()] == [items[0].id, first.id]


def test_edit_and_resend_shows_the_new_version(make_window, qtbot):
    w = make_window(max_new_tokens=12)
    send(qtbot, w, "first question")
    wait_reply(qtbot, w)
    send(qtbot, w, "second question")
    wait_reply(qtbot, w)
    first = w.messages.items()[0]
    click_action(qtbot, w, first.id, "edit")
    assert w.composer.editing_message_id == first.id
    assert w.composer.text() == "first question" and w.composer.banner.isVisible()
    w.composer.edit.selectAll()
    qtbot.keyClicks(w.composer.edit, "changed question")
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
    wait_reply(qtbot, w)
    items = w.messages.items()
    assert [(i.role, i.text if i.role == "user" else "") for i in items] == [
        ("user", "changed question"),
        ("assistant", ""),
    ]
    assert items[0].edited and items[0].id != first.id and items[0].versions == (2, 2)
    stored = w.history.messages(w.controller.current_id)
    assert [(m.role, m.text) for m in stored] == [(i.role, i.text) for i in items]
    assert stored[0].edited is not None
    assert not w.composer.banner.isVisible()


def test_copy_puts_the_message_on_the_clipboard(make_window, qtbot):
    w = make_window(max_new_tokens=8)
    send(qtbot, w, "copy me")
    wait_reply(qtbot, w)
    user = w.messages.items()[0]
    click_action(qtbot, w, user.id, "copy")
    assert QGuiApplication.clipboard().text() == "copy me"


def test_conversations_new_rename_delete_undo_search(make_window, qtbot):
    w = make_window(max_new_tokens=8)
    send(qtbot, w, "about a red triangle")
    wait_reply(qtbot, w)
    a = w.controller.current_id
    qtbot.keyClick(w, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    b = w.controller.current_id
    assert b != a and w.messages.rowCount() == 0
    send(qtbot, w, "about a blue circle")
    wait_reply(qtbot, w)
    assert [r.id for r in w.sidebar.model.rows] == [b, a]  # newest first

    w.controller.rename(a, "Triangles")
    assert w.sidebar.model.rows[1].title == "Triangles"

    w.sidebar.search.setText("circle")
    qtbot.waitUntil(lambda: [r.id for r in w.sidebar.model.rows] == [b], timeout=5000)
    w.sidebar.search.clear()
    qtbot.waitUntil(lambda: len(w.sidebar.model.rows) == 2, timeout=5000)

    w.sidebar.delete(b)
    assert [r.id for r in w.sidebar.model.rows] == [a]
    assert w.controller.current_id == a and w.sidebar.undo_bar.isVisible()
    qtbot.mouseClick(w.sidebar.undo_button, Qt.MouseButton.LeftButton)
    assert [r.id for r in w.sidebar.model.rows] == [b, a]
    assert [m.text for m in w.history.messages(b)][0] == "about a blue circle"


def test_restart_shows_the_same_conversations(make_window, qtbot, tmp_path):
    data = tmp_path / "shared-data"
    w1 = make_window(data_dir=data, max_new_tokens=10)
    pic = make_picture(tmp_path / "p.png", seed=5)
    w1.composer.take_files([str(pic)])
    send(qtbot, w1, "remember this picture")
    wait_reply(qtbot, w1)
    before = [(i.role, i.text, len(i.pictures)) for i in w1.messages.items()]
    cid = w1.controller.current_id
    w1.close()
    pic.unlink()  # the conversation must not depend on the original file

    w2 = make_window(data_dir=data, load=False)
    assert [r.id for r in w2.sidebar.model.rows] == [cid]
    assert w2.controller.current_id == cid
    assert [(i.role, i.text, len(i.pictures)) for i in w2.messages.items()] == before
    from pathlib import Path

    assert Path(w2.messages.items()[0].pictures[0]).is_file()


def test_no_model_means_no_send_and_a_hint(make_window, qtbot, tmp_path):
    w = make_window(load=False)
    assert "No model" in w.chat.placeholder
    w.load_model(str(tmp_path / "not-a-model"))
    qtbot.waitUntil(lambda: w.notice.isVisible(), timeout=TIMEOUT_MS)
    assert "not found" in w.notice.text()
    assert not w.composer.send.isEnabled()
    send(qtbot, w, "hello?")
    assert w.messages.rowCount() == 0 and w.composer.text() == "hello?"


def test_a_replys_turn_line_is_still_there_after_a_restart(make_window, qtbot, tmp_path):
    """Each reply keeps its line ("Read 50 tokens … · 12 tok/s") when the app starts again."""
    data = tmp_path / "data"
    w = make_window(data_dir=data, max_new_tokens=4)
    send(qtbot, w, "first question")
    wait_reply(qtbot, w)
    send(qtbot, w, "second question")
    wait_reply(qtbot, w)
    lines = [m.note for m in w.messages.items() if m.role == "assistant"]
    assert len(lines) == 2 and all(lines) and lines[0] != lines[1]
    cid = w.controller.current_id
    w.shutdown()

    again = make_window(data_dir=data, load=False)  # before any model: the lines come from history
    assert again.controller.current_id == cid
    assert [m.note for m in again.messages.items() if m.role == "assistant"] == lines


def test_a_deleted_chat_says_how_to_undo_and_ctrl_z_in_the_composer_undoes_typing_first(make_window, qtbot):
    """Issue 40: deleting a chat gave no hint, and Ctrl+Z did nothing while the composer had focus.
    Ctrl+Z undoes the composer's typing first; with no typing left, it brings the deleted chat back."""
    w = make_window(max_new_tokens=2)
    send(qtbot, w, "keep me")
    wait_reply(qtbot, w)
    kept = w.controller.current_id
    w.delete_current()
    assert w.controller.current_id != kept and w.history.get_conversation(kept).deleted is not None
    hint = w.statusBar().currentMessage()
    assert "Deleted “keep me”" in hint and "Ctrl+Z" in hint
    assert w.sidebar.undo_bar.isVisible() and "Ctrl+Z" in w.sidebar.undo_button.toolTip()

    w.composer.edit.setFocus()
    qtbot.keyClicks(w.composer.edit, "a new draft")
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert w.composer.text() == ""  # the typing went first
    assert w.history.get_conversation(kept).deleted is not None
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert w.history.get_conversation(kept).deleted is None  # then the delete
    assert w.controller.current_id == kept and [m.text for m in w.messages.items()][0] == "keep me"
    assert not w.sidebar.undo_bar.isVisible()


def test_export_chat_from_the_file_menu_writes_markdown_and_pictures(make_window, qtbot, tmp_path, monkeypatch):
    """File ▸ Export chat… asks for a folder (the dialog answered here), writes off the UI thread and
    says where in the status bar; the sidebar's menu asks the same."""
    from app.chat import chat_export

    w = make_window()
    w.composer.take_files([str(make_picture(tmp_path / "shapes.png", seed=3))])
    send(qtbot, w, "What is in this picture?")
    wait_reply(qtbot, w)
    out = tmp_path / "exported"
    asked: list[str] = []
    monkeypatch.setattr(
        chat_export.QFileDialog, "getExistingDirectory", lambda _parent, title, _start: asked.append(title) or str(out)
    )
    action = next(a for a in w.menuBar().actions()[0].menu().actions() if a.text() == "Export chat…")
    action.trigger()
    qtbot.waitUntil(lambda: w.statusBar().currentMessage().startswith("Exported to"), timeout=TIMEOUT_MS)
    [md] = out.glob("*.md")
    text = md.read_text(encoding="utf-8")
    assert "What is in this picture?" in text and w.messages.items()[-1].text.strip() in text
    assert (md.with_suffix("") / "01 shapes.png").is_file()
    w.sidebar.exportRequested.emit(w.controller.current_id)
    qtbot.waitUntil(lambda: len(list(out.glob("*.md"))) == 2, timeout=TIMEOUT_MS)
    assert asked == ["Export the chat into…"] * 2
