"""Fixtures for the window tests: a real Engine with a tiny model behind a real MainWindow.

Import the fixtures into a test module (`from tests.test_app_support import make_window`).
Preferences live in a per-test ini file, so no test touches the user's settings.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, QSettings, Qt

import app  # noqa: F401  (applies the PySide6 refcount workaround before any signal)
from app.connection.bridge import EngineBridge
from app.history.history import History
from app.settings.preferences import Preferences
from app.shell.main_window import MainWindow
from engine.protocol.events import Sampling

TIMEOUT_MS = 60_000


def make_prefs(path: Path, max_new_tokens: int = 24) -> Preferences:
    prefs = Preferences(QSettings(str(path), QSettings.Format.IniFormat))
    prefs.set_sampling(Sampling(greedy=True, max_new_tokens=max_new_tokens))
    return prefs


@pytest.fixture
def make_window(qtbot, tmp_path, tiny_model):
    """make_window(data_dir=None, family="llava", max_new_tokens=24, load=True) -> MainWindow."""
    made: list[MainWindow] = []

    def make(
        data_dir: Path | None = None, family: str = "llava", max_new_tokens: int = 24, load: bool = True
    ) -> MainWindow:
        data_dir = Path(data_dir or tmp_path / "data")
        prefs = make_prefs(tmp_path / f"prefs-{len(made)}.ini", max_new_tokens)
        history = History(data_dir)
        bridge = EngineBridge.create(prefs.engine_settings(), data_dir)
        w = MainWindow(bridge, history, prefs, data_dir)
        qtbot.addWidget(w)
        w.resize(1100, 750)
        w.show()
        made.append(w)
        if load:
            w.load_model(str(tiny_model(family)))
            qtbot.waitUntil(lambda: w.model_ready, timeout=TIMEOUT_MS)
        return w

    yield make
    for w in made:
        w.shutdown()


def send(qtbot, w: MainWindow, text: str) -> None:
    """Type into the composer and press Enter, as a user would."""
    w.composer.edit.setFocus()
    qtbot.keyClicks(w.composer.edit, text)
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)


def wait_reply(qtbot, w: MainWindow) -> None:
    qtbot.waitUntil(lambda: not w.controller.is_generating(), timeout=TIMEOUT_MS)


def click_action(qtbot, w: MainWindow, message_id: int, name: str) -> None:
    """Click a message's action link ("copy" | "edit" | "regenerate") where it is drawn."""
    point = w.chat.action_point(message_id, name)
    assert point is not None, f"no {name} action on message {message_id}"
    qtbot.mouseMove(w.chat.viewport(), point)
    qtbot.mouseClick(w.chat.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(point))
