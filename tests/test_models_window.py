"""The Models page from the window: the menu and the empty chat's button; a model it hands back loads."""
from __future__ import annotations

from PySide6.QtCore import Qt

from tests.test_app_support import TIMEOUT_MS, make_window  # noqa: F401


def test_empty_chat_button_opens_models_and_a_chosen_model_loads(make_window, qtbot, tiny_model, tmp_path,
                                                                  monkeypatch):
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
