"""The Models page from the window: the menu and the empty chat's button; a model it hands back loads."""

from __future__ import annotations

from PySide6.QtCore import Qt

from tests.fixtures.pictures import make_picture
from tests.helpers.window import TIMEOUT_MS, send, wait_reply


def test_empty_chat_button_opens_models_and_a_chosen_model_loads(make_window, qtbot, tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network in tests: the page says so and lists what is here
    w = make_window(load=False)
    button = w.empty_actions.models
    assert button.isVisible() and button.text() == "Get a model…"
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    page = w.models_page
    assert page is not None and page.isVisible() and page.table.rowCount() >= 9  # the catalog
    page.loadRequested.emit(str(tiny_model("llava")))
    qtbot.waitUntil(lambda: w.model_ready, timeout=TIMEOUT_MS)
    assert not button.isVisible()
    assert page.wait_idle()
    page.close()
    w.menus.act_models.trigger()  # the menu opens it too
    assert w.models_page is not None and w.models_page.isVisible()
    assert w.models_page.wait_idle()


def test_the_demo_model_says_what_it_is_and_offers_a_real_one(make_window, qtbot, tiny_model, tmp_path, monkeypatch):
    """A newcomer's first screen with the built-in model: one line saying it is a small demo that
    knows coloured shapes, and a button to the Models page; gone once a real model is loaded."""
    from engine.platform.paths import DEMO_MODEL

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    w = make_window(load=False)
    w.load_model(str(DEMO_MODEL))
    qtbot.waitUntil(lambda: w.model_ready, timeout=TIMEOUT_MS)
    assert "small demo that only knows coloured shapes" in w.chat.placeholder
    demo_name = w.model_name
    button = w.empty_actions.models
    assert button.isVisible() and button.text() == "Get a real model…"
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    page = w.models_page
    assert page is not None and page.isVisible()
    check_the_demo_row(qtbot, w, page)
    page.loadRequested.emit(str(tiny_model("llava")))  # a real model, as the page hands it back
    qtbot.waitUntil(lambda: w.model_ready and w.model_name != demo_name, timeout=TIMEOUT_MS)
    assert "demo" not in w.chat.placeholder and not button.isVisible()
    assert page.wait_idle()
    page.close()

    w.load_model(str(DEMO_MODEL))  # back on the demo: the line and the button come back ...
    qtbot.waitUntil(lambda: w.model_ready and w.model_name == demo_name, timeout=TIMEOUT_MS)
    assert "small demo" in w.chat.placeholder and button.isVisible()
    send(qtbot, w, "hello")  # ... and go with the first message, as the hint does
    wait_reply(qtbot, w)
    assert w.messages.rowCount() == 2 and not button.isVisible()


def test_the_demo_offers_example_questions_with_their_drawing(make_window, qtbot, tiny_model, tmp_path):
    """Issue 43: with the built-in demo, the first screen offers three questions it answers well. A
    click puts one into the composer with the example drawing (once, and not over a picture the
    person already attached); Send asks it; the questions go with the first message, and a real
    model is not offered them."""
    from app.shell.empty_chat import EXAMPLE_QUESTIONS, example_picture
    from engine.platform.paths import DEMO_MODEL

    w = make_window(load=False)
    w.load_model(str(DEMO_MODEL))
    qtbot.waitUntil(lambda: w.model_ready, timeout=TIMEOUT_MS)
    demo_name = w.model_name
    assert w.prefs.last_model() is None  # remembered as "the demo", not as this install's folder
    buttons = w.empty_actions.example_buttons()
    assert [b.text() for b in buttons] == list(EXAMPLE_QUESTIONS)
    assert all(b.isVisible() for b in buttons) and w.empty_actions.models.isVisible()
    assert w.empty_actions.geometry().bottom() < w.chat.viewport().height()
    qtbot.mouseClick(buttons[1], Qt.MouseButton.LeftButton)
    assert w.composer.text() == EXAMPLE_QUESTIONS[1]
    assert [a.name for a in w.composer.attachments()] == [example_picture().name]
    qtbot.mouseClick(buttons[0], Qt.MouseButton.LeftButton)  # another question: the drawing is not added twice
    assert w.composer.text() == EXAMPLE_QUESTIONS[0] and len(w.composer.attachments()) == 1
    assert w.composer.edit.hasFocus()  # Enter sends it
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)
    wait_reply(qtbot, w)
    assert w.messages.rowCount() == 2 and not any(b.isVisible() for b in buttons)
    reply = w.messages.item(1).text
    assert "red circle" in reply and "blue square" in reply, reply  # word for word: tests/packaging

    w.new_chat()  # an empty chat again, a picture of the person's own in the draft
    qtbot.waitUntil(lambda: all(b.isVisible() for b in buttons), timeout=TIMEOUT_MS)
    tiny_picture = make_picture(tmp_path / "mine.png", seed=3)
    w.composer.take_files([str(tiny_picture)])
    qtbot.mouseClick(buttons[2], Qt.MouseButton.LeftButton)
    assert w.composer.text() == EXAMPLE_QUESTIONS[2]
    assert [a.name for a in w.composer.attachments()] == [tiny_picture.name]

    w.load_model(str(tiny_model("llava")))  # a real model: no examples
    qtbot.waitUntil(lambda: w.model_ready and w.model_name != demo_name, timeout=TIMEOUT_MS)
    assert not any(b.isVisible() for b in buttons)
    assert w.prefs.last_model() == str(tiny_model("llava"))


def test_an_updated_or_moved_install_opens_its_own_demo(tmp_path):
    """An older Parley remembered the demo as its install's folder: after an update (a new bundle
    folder) or a move, the next start opened the old copy, with no demo hint and no example
    questions. That folder is read as the demo, and this install's demo opens."""
    from PySide6.QtCore import QSettings

    from app.settings.preferences import Preferences
    from app.shell.main import choose_model
    from engine.platform.paths import DEMO_MODEL

    old_install = tmp_path / "Parley-0.9" / "resources" / "models" / DEMO_MODEL.name
    old_install.mkdir(parents=True)
    (old_install / "config.json").write_text("{}")
    prefs = Preferences(QSettings(str(tmp_path / "Parley.conf"), QSettings.Format.IniFormat))
    prefs.set_last_model(str(old_install))
    assert choose_model(None, prefs) == str(DEMO_MODEL)
    own = tmp_path / "my-model"
    own.mkdir()
    (own / "config.json").write_text("{}")
    prefs.set_last_model(str(own))  # a model of the person's own still opens
    assert choose_model(None, prefs) == str(own)
    prefs.set_last_model(None)
    assert choose_model(None, prefs) == str(DEMO_MODEL)


def check_the_demo_row(qtbot, w, page) -> None:
    """Issue 40: the page sized fits at bfloat16 while the app ran float32, and the demo's row had
    no parameter count and an empty "Speed here". Now the page sizes at the precision the loaded
    model runs in (the status bar's), and the demo's row says its parameters and why it has no
    measured speed (a small model is fast in any format)."""
    from app.models.models_page import COL_FIT, COL_PARAMS, COL_SPEED
    from engine.model.speed import SMALL_MODEL

    running = w.status.device_label.text().rsplit(" · ", 1)[-1]  # "cpu · float32"
    assert page.precision.currentText() == running
    r = page.row_of(w.model_path)
    assert r is not None
    qtbot.waitUntil(lambda: page.table.item(r, COL_SPEED).text() != "", timeout=TIMEOUT_MS)
    assert page.table.item(r, COL_SPEED).text() == SMALL_MODEL
    assert page.table.item(r, COL_PARAMS).text().endswith("M")  # a few million: "2.63M"
    assert f", {running})" in page.table.item(r, COL_FIT).toolTip()  # the fit is sized at it too
