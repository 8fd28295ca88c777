"""The main window's menus and status bar, built onto the window (its actions and labels are
the window's attributes: shortcuts, tests and handlers reach them there)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence, QShortcut
from PySide6.QtWidgets import QLabel, QProgressBar

from .api_control import FAILED, LISTENING, OFF
from .icons import icon

if TYPE_CHECKING:
    from .main_window import MainWindow


def build_status_bar(window: MainWindow) -> None:
    """Busy bar, API address, engine, model, device and speed, right-aligned."""
    sb = window.statusBar()
    window.progress = QProgressBar()
    window.progress.setRange(0, 0)  # busy: loading reports no fraction
    window.progress.setMaximumWidth(140)
    window.progress.hide()
    window.model_label = QLabel("No model")
    window.device_label = QLabel("")
    window.speed_label = QLabel("")
    window.api_label = QLabel("")
    window.api_label.setObjectName("apiStatus")
    window.api_label.hide()
    for w in (window.progress, window.api_label, window.engines.label, window.model_label, window.device_label,
              window.speed_label):
        sb.addPermanentWidget(w)


def build_menus(window: MainWindow) -> None:
    """File, Edit, View and Help; the actions tests and shortcuts use stay on the window."""
    mb = window.menuBar()
    file = mb.addMenu("&File")
    window.act_new = file.addAction(icon("new-chat"), "New chat", window.new_chat)
    window.act_new.setShortcut(QKeySequence.StandardKey.New)
    window.act_open = file.addAction(icon("model"), "Open model…", window.choose_model)
    window.act_open.setShortcut(QKeySequence.StandardKey.Open)
    window.act_models = file.addAction("Models…", window.open_models)
    file.addSeparator()
    window.act_settings = file.addAction("Settings…", window.open_settings)
    window.act_settings.setShortcut(QKeySequence.StandardKey.Preferences)
    window.act_settings.setMenuRole(QAction.MenuRole.PreferencesRole)
    file.addSeparator()
    act_quit = file.addAction("Quit", window.close)
    act_quit.setShortcut(QKeySequence.StandardKey.Quit)
    act_quit.setMenuRole(QAction.MenuRole.QuitRole)

    edit = mb.addMenu("&Edit")
    window.act_undo = edit.addAction("Undo delete", window.sidebar.undo_delete)
    window.act_undo.setShortcut(QKeySequence.StandardKey.Undo)
    window.act_undo.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
    window.sidebar.addAction(window.act_undo)
    edit.addAction("Rename chat", window.sidebar.rename_current, QKeySequence(Qt.Key.Key_F2))
    edit.addAction("Delete chat", window.delete_current)
    edit.addAction("Chat instructions…", window.edit_chat_prompt)
    edit.addSeparator()
    window.act_regen = edit.addAction("Regenerate reply", lambda: window.controller.regenerate())
    window.act_regen.setShortcut(QKeySequence("Ctrl+R"))
    window.act_regen_varied = edit.addAction("Regenerate reply (more varied)",
                                             lambda: window.controller.regenerate(varied=True))
    window.act_regen_varied.setShortcut(QKeySequence("Ctrl+Shift+R"))
    window.act_stop = edit.addAction("Stop reply", window.stop_or_cancel)
    window.act_stop.setShortcut(QKeySequence(Qt.Key.Key_Escape))
    window.act_stop.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
    edit.addAction("Find chat", lambda: window.sidebar.search.setFocus(), QKeySequence.StandardKey.Find)

    view = mb.addMenu("&View")
    toggle = window.memory_dock.toggleViewAction()
    toggle.setShortcut(QKeySequence("Ctrl+M"))
    toggle.setIcon(icon("memory"))
    view.addAction(toggle)
    help_menu = mb.addMenu("&Help")
    help_menu.addAction("About Parley", window.show_about)

    paste = QShortcut(QKeySequence.StandardKey.Paste, window.chat)
    paste.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
    paste.activated.connect(window.paste_into_composer)


def show_api_state(window: MainWindow, state: str, detail: str) -> None:
    """The status bar's API label and a passing message for each server state."""
    if state == LISTENING:
        window.api_label.setText(f"API {detail.removeprefix('http://').removesuffix('/v1')}")
        window.api_label.setToolTip(f"OpenAI-compatible API listening on {detail}")
        window.statusBar().showMessage(f"API server listening on {detail}", 6000)
    elif state == FAILED:
        window.api_label.setText('<span style="color:#d0473f">API not running</span>')
        window.api_label.setToolTip(detail)
    elif state == OFF:
        window.statusBar().showMessage("API server off", 4000)
    window.api_label.setVisible(state != OFF)
