"""The window and its dialogs on small screens (issue 27): every dialog fits a 1280×720 screen, and a
900×600 window keeps a usable conversation (the memory dock gives way first)."""

from __future__ import annotations

from PySide6.QtCore import QSize, QTimer
from PySide6.QtWidgets import QApplication, QDialog, QMessageBox

# a 1280×720 screen less a 40 px panel and a 32 px title bar
ROOM = QSize(1280, 720 - 40 - 32)
CHAT_MIN_WIDTH = 400  # a bubble of ~40 characters next to the picture thumbnails


def assert_fits(dlg: QDialog, what: str) -> None:
    for name, size in (("size hint", dlg.sizeHint()), ("minimum", dlg.minimumSizeHint()), ("size", dlg.size())):
        assert size.width() <= ROOM.width() and size.height() <= ROOM.height(), (
            f"{what}: {name} {size.width()}×{size.height()} does not fit {ROOM.width()}×{ROOM.height()}"
        )


def modal_sizes(trigger) -> list[tuple[str, QSize, QSize]]:
    """Run `trigger` (which opens a modal dialog and blocks); read the dialog's sizes and close it."""
    seen = []

    def look():
        dlg = QApplication.activeModalWidget()
        if dlg is None:
            return QTimer.singleShot(20, look)
        seen.append((dlg.windowTitle(), dlg.sizeHint(), dlg.size()))
        dlg.reject()

    QTimer.singleShot(0, look)
    trigger()
    return seen


def test_every_dialog_fits_a_1280x720_screen(make_window, qtbot, tmp_path, tiny_model):
    from app.models.model_picker import ModelPicker
    from app.models.models_page import ModelsPage
    from app.settings.settings_dialog import SettingsDialog

    w = make_window(load=False)
    dlg = SettingsDialog(w.prefs, w.data_dir, w, api_apply=w.apply_api)
    qtbot.addWidget(dlg)
    assert_fits(dlg, "Settings")
    # with both of its problems on show (each brings its own tab forward)
    dlg.engine_box.remote.setChecked(True)
    dlg.accept()
    assert dlg.engine_box.error.isVisibleTo(dlg) or dlg.tabs.currentWidget().isAncestorOf(dlg.engine_box)
    dlg.show_api_error("Cannot listen on 127.0.0.1:8011: the address is already in use " * 3)
    assert dlg.tabs.currentWidget().isAncestorOf(dlg.api_error)
    assert_fits(dlg, "Settings with its problems shown")

    page = ModelsPage(recent=[str(tiny_model("llava"))], parent=w)
    qtbot.addWidget(page)
    assert_fits(page, "Models")
    page.cancel.set()
    assert page.wait_idle()

    picker = ModelPicker([str(tiny_model("llava"))], w.bridge.check_model_folder, parent=w)
    qtbot.addWidget(picker)
    assert_fits(picker, "Choose a model")

    w.new_chat()
    opened = modal_sizes(w.show_about) + modal_sizes(w.edit_chat_prompt)
    assert [title for title, _, _ in opened] == ["About Parley", "Chat instructions"]
    for title, hint, size in opened:
        for s in (hint, size):
            assert s.width() <= ROOM.width() and s.height() <= ROOM.height(), (title, s)

    box = QMessageBox(
        QMessageBox.Icon.Warning, "Chat history was damaged", "x " * 400, QMessageBox.StandardButton.Ok, w
    )
    assert box.sizeHint().height() <= ROOM.height()


def test_a_small_window_keeps_the_chat_usable_and_the_dock_gives_way(make_window, qtbot):
    w = make_window(load=False)
    w.resize(1400, 900)
    qtbot.waitUntil(lambda: w.width() == 1400)
    wide_dock = w.memory_dock.width()
    for width, height in ((1280, 720), (900, 600)):
        w.resize(width, height)
        qtbot.waitUntil(lambda width=width: w.width() == width)
        QApplication.processEvents()
        assert w.chat.width() >= CHAT_MIN_WIDTH, (width, w.chat.width(), w.memory_dock.width(), w.sidebar.width())
        assert w.composer.edit.width() >= CHAT_MIN_WIDTH - 100
    assert w.memory_dock.isVisible() and w.memory_dock.width() < wide_dock
    # the whole window still fits the screen it is on: nothing is pushed past its right edge
    assert w.minimumSizeHint().width() <= 900 and w.minimumSizeHint().height() <= 600


def test_the_narrow_dock_and_sidebar_need_no_sideways_scrolling(make_window, qtbot):
    w = make_window(max_new_tokens=4)
    from tests.helpers.window import send, wait_reply

    send(qtbot, w, "What is in this picture, described at some length please?")
    wait_reply(qtbot, w)
    w.memory_dock.refresh_now()
    w.resize(900, 600)
    qtbot.waitUntil(lambda: w.width() == 900)
    QApplication.processEvents()
    scroll = w.memory_dock.widget()
    assert scroll.widget().minimumSizeHint().width() <= scroll.viewport().width()
    assert not w.sidebar.list.horizontalScrollBar().isVisible()


def _inside(w, widget) -> bool:
    """`widget` lies wholly inside the window's visible area."""
    from PySide6.QtCore import QRect

    top_left = widget.mapTo(w, widget.rect().topLeft())
    return w.rect().contains(QRect(top_left, widget.size()))


def _uncovered(w, widget) -> bool:
    """No part of the memory dock lies over `widget`."""
    from PySide6.QtCore import QRect

    if not w.memory_dock.isVisible():
        return True
    dock = QRect(w.memory_dock.mapTo(w, w.memory_dock.rect().topLeft()), w.memory_dock.size())
    mine = QRect(widget.mapTo(w, widget.rect().topLeft()), widget.size())
    return not dock.intersects(mine)


def test_an_800x500_window_keeps_send_in_sight_with_the_dock_shown_hidden_and_shown(make_window, qtbot):
    """Issue 40: at 800×500 the dock covered the chat and Send; after Ctrl+M twice the window's
    content ran past its right edge (the three parts needed 870 px)."""
    from app.composer.composer_edit import PLACEHOLDERS

    w = make_window(load=False)
    toggle = w.memory_dock.toggleViewAction()
    for step in ("shown", "hidden", "shown again"):
        if step != "shown":
            toggle.trigger()
        w.resize(800, 500)
        qtbot.waitUntil(lambda: w.size() == QSize(800, 500))
        QApplication.processEvents()
        assert w.memory_dock.isVisible() == (step != "hidden")
        assert w.minimumSizeHint().width() <= 800, step  # the window need not be wider than the screen
        for part in (w.composer.send, w.composer.edit, w.composer.attach, w.chat, w.sidebar.search):
            assert part.isVisible() and _inside(w, part) and _uncovered(w, part), (step, part)
        assert w.chat.width() >= CHAT_MIN_WIDTH
        # the composer's hint fits its one line instead of being cut in half
        edit = w.composer.edit
        assert edit.placeholderText() in PLACEHOLDERS
        assert edit.fontMetrics().horizontalAdvance(edit.placeholderText()) <= edit.viewport().width()
        # the dock's words wrap rather than run past its right edge
        scroll = w.memory_dock.widget()
        if w.memory_dock.isVisible():
            assert scroll.widget().minimumSizeHint().width() <= scroll.viewport().width(), step


def test_a_long_chat_title_is_cut_at_its_end_and_keeps_its_number(qapp):
    from PySide6.QtGui import QFontMetrics

    from app.chat.sidebar import elide_title

    fm = QFontMetrics(qapp.font())
    title = "What shape is on the left side of the second picture? (2)"
    width = fm.horizontalAdvance("What shape is on the left")
    cut = elide_title(title, fm, width)
    assert cut.startswith("What shape is") and cut.endswith("… (2)") and fm.horizontalAdvance(cut) <= width
    assert elide_title("Short", fm, width) == "Short"


def test_a_long_status_message_ends_before_the_engine_label(make_window, qtbot):
    """Issue 40: "…More varied samples a different one." ran into "Built-in engine"."""
    w = make_window()
    w.resize(900, 600)
    qtbot.waitUntil(lambda: w.width() == 900)
    QApplication.processEvents()
    long = (
        "The same reply again: replies are greedy (Settings ▸ Replies), so the model picks its most likely "
        "words each time. More varied samples a different one."
    )
    w.statusBar().showMessage(long, 12000)
    shown = w.statusBar().currentMessage()
    engine = w.engines.label
    assert engine.isVisible()
    assert shown.endswith("…") and long.startswith(shown[:-1])
    assert w.statusBar().fontMetrics().horizontalAdvance(shown) < engine.geometry().left()
    assert w.statusBar().toolTip() == long  # the whole message is still there to read
    w.statusBar().showMessage("Copied", 1500)  # a short one is shown whole
    assert w.statusBar().currentMessage() == "Copied"


def test_a_first_launch_window_fits_the_screen_so_the_composer_is_in_sight(qtbot, tmp_path):
    """No saved geometry: the window opens at most the screen's free size (on a 1280 x 720 screen
    a 1200 x 800 window hid the composer and the status bar below its edge)."""
    from app.connection.bridge import EngineBridge
    from app.history.history import History
    from app.shell.main_window import MainWindow
    from tests.helpers.window import make_prefs

    prefs = make_prefs(tmp_path / "prefs.ini")
    w = MainWindow(
        EngineBridge.create(prefs.engine_settings(), tmp_path / "data"),
        History(tmp_path / "data"),
        prefs,
        tmp_path / "data",
    )
    qtbot.addWidget(w)
    try:
        free = w.screen().availableGeometry().size()
        assert w.width() <= free.width() and w.height() <= free.height(), (w.size(), free)
        w.show()
        qtbot.waitExposed(w)
        composer = w.composer.mapTo(w, w.composer.rect().bottomRight())
        assert composer.y() <= free.height()
    finally:
        w.shutdown()
