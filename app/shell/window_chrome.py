"""The main window's status line and menus, as two components the window holds (`status`,
`menus`); their labels and actions are theirs. The menus call the window back through the
`MenuHost` protocol below, so this module never imports main_window."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence, QShortcut
from PySide6.QtWidgets import QDockWidget, QLabel, QMenuBar, QProgressBar, QStatusBar, QWidget

from ..icons import icon
from ..settings import FAILED, LISTENING, OFF

if TYPE_CHECKING:  # types only: the window builds both
    from engine.protocol.turn_stats import TurnStats

    from ..chat import ChatController, Sidebar


class StatusBar(QStatusBar):
    """A status bar whose passing messages end before its permanent labels: a long message is
    cut with "…" (the whole of it in the tooltip) instead of being drawn under "Built-in engine"."""

    def showMessage(self, text: str, timeout: int | None = 0) -> None:
        room = self.message_room()
        fm = self.fontMetrics()
        shown = text if fm.horizontalAdvance(text) <= room else fm.elidedText(text, Qt.TextElideMode.ElideRight, room)
        self.setToolTip(text if shown != text else "")
        super().showMessage(shown, timeout or 0)

    def message_room(self) -> int:
        """Pixels from the bar's left edge to its first shown permanent label, less a gap."""
        lefts = [
            w.geometry().left()
            for w in self.findChildren(QWidget, options=Qt.FindChildOption.FindDirectChildrenOnly)
            if w.isVisible() and w.geometry().left() > 0
        ]
        return max(0, min(lefts, default=self.width()) - 16)


class StatusLine:
    """Busy bar, API address, engine, model, device and speed, right-aligned in the status bar."""

    def __init__(self, bar: QStatusBar, engine_label: QLabel):
        self.bar = bar
        self.progress = QProgressBar()
        self.progress.setRange(0, 0)  # busy: loading reports no fraction
        self.progress.setMaximumWidth(140)
        self.progress.hide()
        self.model_label = QLabel("No model")
        self.device_label = QLabel("")
        self.speed_label = QLabel("")
        self.api_label = QLabel("")
        self.api_label.setObjectName("apiStatus")
        self.api_label.hide()
        for w in (self.progress, self.api_label, engine_label, self.model_label, self.device_label, self.speed_label):
            bar.addPermanentWidget(w)

    def show_speed(self, tokens_per_s: float | None) -> None:
        self.speed_label.setText("" if tokens_per_s is None else f"{tokens_per_s:.1f} tok/s")

    def show_api_state(self, state: str, detail: str) -> None:
        """The API label and a passing message for each server state."""
        if state == LISTENING:
            self.api_label.setText(f"API {detail.removeprefix('http://').removesuffix('/v1')}")
            self.api_label.setToolTip(f"OpenAI-compatible API listening on {detail}")
            self.bar.showMessage(f"API server listening on {detail}", 6000)
        elif state == FAILED:
            self.api_label.setText('<span style="color:#d0473f">API not running</span>')
            self.api_label.setToolTip(detail)
        elif state == OFF:
            self.bar.showMessage("API server off", 4000)
        self.api_label.setVisible(state != OFF)


class SpeedMeter:
    """Tokens per second in the status line: measured here while a reply streams, then the
    engine's own figure from the turn's stats. A failed turn or another engine clears it: the
    last speed shown is no longer the latest."""

    WARM_UP_S = 0.2  # the first tokens' rate says little: wait before showing one

    def __init__(self, status: StatusLine):
        self.status = status
        self._turns: dict[int, tuple[float, int]] = {}  # turn id -> (started, tokens so far)

    def started(self, turn_id: int) -> None:
        self._turns[turn_id] = (time.monotonic(), 0)

    def tokens(self, turn_id: int, count: int) -> None:
        if turn_id not in self._turns:
            return
        t0, n = self._turns[turn_id]
        self._turns[turn_id] = (t0, n + count)
        elapsed = time.monotonic() - t0
        if elapsed > self.WARM_UP_S:
            self.status.show_speed((n + count) / elapsed)

    def done(self, turn_id: int, stats: TurnStats) -> None:
        self._turns.pop(turn_id, None)
        if stats.generated_tokens:  # a turn stopped before it began measured nothing
            self.status.show_speed(stats.tokens_per_s)

    def clear(self, turn_id: int | None = None) -> None:
        if turn_id is not None:
            self._turns.pop(turn_id, None)
        self.status.show_speed(None)


class MenuHost(Protocol):
    """What the menus call on the window."""

    sidebar: Sidebar  # undo_delete, rename_current and its search field
    controller: ChatController  # regenerate()

    @property
    def memory_dock(self) -> QDockWidget: ...  # read-only: any dock widget, e.g. MemoryDock
    @property
    def chat(self) -> QWidget: ...  # read-only: any widget, e.g. ChatView

    def new_chat(self) -> None: ...
    def choose_model(self) -> None: ...
    def open_models(self) -> None: ...
    def open_settings(self) -> None: ...
    def close(self) -> bool: ...
    def delete_current(self) -> None: ...
    def export_current(self) -> None: ...
    def edit_chat_prompt(self) -> None: ...
    def stop_or_cancel(self) -> None: ...
    def show_about(self) -> None: ...
    def paste_into_composer(self) -> None: ...


class WindowMenus:
    """File, Edit, View and Help; the actions shortcuts and tests use are attributes here."""

    def __init__(self, mb: QMenuBar, window: MenuHost):
        file = mb.addMenu("&File")
        self.act_new = file.addAction(icon("new-chat"), "New chat", window.new_chat)
        self.act_new.setShortcut(QKeySequence.StandardKey.New)
        self.act_open = file.addAction(icon("model"), "Open model…", window.choose_model)
        self.act_open.setShortcut(QKeySequence.StandardKey.Open)
        self.act_models = file.addAction("Models…", window.open_models)
        file.addSeparator()
        file.addAction("Export chat…", window.export_current)
        file.addSeparator()
        self.act_settings = file.addAction("Settings…", window.open_settings)
        self.act_settings.setShortcut(QKeySequence.StandardKey.Preferences)
        self.act_settings.setMenuRole(QAction.MenuRole.PreferencesRole)
        file.addSeparator()
        act_quit = file.addAction("Quit", window.close)
        act_quit.setShortcut(QKeySequence.StandardKey.Quit)
        act_quit.setMenuRole(QAction.MenuRole.QuitRole)

        edit = mb.addMenu("&Edit")
        self.act_undo = edit.addAction("Undo delete", window.sidebar.undo_delete)
        self.act_undo.setShortcut(QKeySequence.StandardKey.Undo)
        self.act_undo.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        window.sidebar.addAction(self.act_undo)
        edit.addAction("Rename chat", window.sidebar.rename_current, QKeySequence(Qt.Key.Key_F2))
        edit.addAction("Delete chat", window.delete_current)
        edit.addAction("Chat instructions…", window.edit_chat_prompt)
        edit.addSeparator()
        self.act_regen = edit.addAction("Regenerate reply", lambda: window.controller.regenerate())
        self.act_regen.setShortcut(QKeySequence("Ctrl+R"))
        self.act_regen_varied = edit.addAction(
            "Regenerate reply (more varied)", lambda: window.controller.regenerate(varied=True)
        )
        self.act_regen_varied.setShortcut(QKeySequence("Ctrl+Shift+R"))
        self.act_stop = edit.addAction("Stop reply", window.stop_or_cancel)
        self.act_stop.setShortcut(QKeySequence(Qt.Key.Key_Escape))
        self.act_stop.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        edit.addAction("Find chat", lambda: window.sidebar.search.setFocus(), QKeySequence.StandardKey.Find)

        view = mb.addMenu("&View")
        toggle = window.memory_dock.toggleViewAction()
        toggle.setShortcut(QKeySequence("Ctrl+M"))
        toggle.setIcon(icon("memory"))
        view.addAction(toggle)
        help_menu = mb.addMenu("&Help")
        help_menu.addAction("About Parley", window.show_about)

        self.paste = QShortcut(QKeySequence.StandardKey.Paste, window.chat)
        self.paste.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        self.paste.activated.connect(window.paste_into_composer)
