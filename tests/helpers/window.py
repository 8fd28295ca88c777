"""Fixtures for the window tests: a real Engine with a tiny model behind a real MainWindow.

tests/app/conftest.py makes `make_window` a fixture of every window test; a test elsewhere imports
it from here. Preferences live in a per-test ini file, so no test touches the user's settings.
Also what several window tests do as a person would: type and send, wait for the reply, click a
message's action, drop files, choose an engine or the API server in Settings.
"""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPoint, QPointF, QSettings, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDragMoveEvent, QDropEvent
from PySide6.QtWidgets import QApplication

import app  # noqa: F401  (applies the PySide6 refcount workaround before any signal)
from app.connection.bridge import EngineBridge
from app.history.history import History
from app.settings.preferences import Preferences
from app.settings.settings_dialog import SettingsDialog
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


def drop(widget, mime: QMimeData) -> bool:
    """Drag enter, move and drop on `widget`, as the platform delivers them; True if accepted."""
    pos = QPointF(widget.width() // 2, widget.height() // 2)  # the QPoint constructors are deprecated
    actions = Qt.DropAction.CopyAction
    enter = QDragEnterEvent(pos, actions, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, enter)
    if not enter.isAccepted():
        return False
    move = QDragMoveEvent(pos, actions, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, move)
    ev = QDropEvent(pos, actions, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, ev)
    return ev.isAccepted()


def file_mime(*paths: Path) -> QMimeData:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    return mime


# no proxy from the environment may stand between the test and 127.0.0.1
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with OPENER.open(req, timeout=60) as r:
        return json.loads(r.read())


def settings(
    qtbot, w: MainWindow, enabled: bool, host: str = "127.0.0.1", port: int = 8011, token: str = ""
) -> SettingsDialog:
    """The settings dialog as the window makes it, with the API section filled in."""
    dlg = SettingsDialog(w.prefs, w.data_dir, w, api_apply=w.apply_api)
    qtbot.addWidget(dlg)
    dlg.api_enabled.setChecked(enabled)
    dlg.api_host.setText(host)
    dlg.api_port.setValue(port)
    dlg.api_token.setText(token)
    return dlg


def ok(qtbot, w: MainWindow, dlg: SettingsDialog) -> bool:
    """Press OK; when the dialog takes it, apply it as open_settings does. True if it closed."""
    dlg.accept()
    if dlg.result() != dlg.DialogCode.Accepted:
        return False
    w.apply_settings(dlg)
    return True


def choose_engine(w, qtbot, url: str | None) -> SettingsDialog:
    """Settings ▸ Engine as a person does it: a server address and its model, or Built-in."""
    dlg = SettingsDialog(w.prefs, w.data_dir, w, api_apply=w.apply_api)
    box = dlg.engine_box
    if url is None:
        box.builtin.setChecked(True)
    else:
        box.add_server()
        qtbot.keyClicks(box.url, url)
        with qtbot.waitSignal(box.checked, timeout=30_000) as got:
            box.fetch_models()
        names = got.args[0]
        assert names and box.model.currentText() == names[0]
    dlg.accept()
    assert dlg.result() == dlg.DialogCode.Accepted, box.error.text()
    w.apply_settings(dlg)
    return dlg
