"""The Models page from the window: the menu and the empty chat's button; a model it hands back loads."""

from __future__ import annotations

from PySide6.QtCore import Qt

from tests.helpers.window import TIMEOUT_MS, send, wait_reply


def test_empty_chat_button_opens_models_and_a_chosen_model_loads(make_window, qtbot, tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network in tests: the page says so and lists what is here
    w = make_window(load=False)
    button = w._models_button()
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
    button = w._models_button()
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
