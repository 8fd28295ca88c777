"""Switching the window between the built-in engine and a remote server: the engine in use,
its name in the status bar, and which dock shows its memory (local VRAM or the server's figures).

History stays Parley's, so a conversation carries on across a switch: the server gets the whole
conversation each turn."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, QSettings, Qt
from PySide6.QtWidgets import QDockWidget, QLabel, QMainWindow

from engine.protocol.events import Notice
from engine.remote import RemoteEngine

from ..memory import ServerPanel
from ..settings import EngineChoice, load_choice
from .bridge import EngineBridge


class EngineSwitch(QObject):
    def __init__(
        self, bridge: EngineBridge, qs: QSettings, window: QMainWindow, memory_dock: QDockWidget, data_dir: Path
    ):
        super().__init__(window)
        self.bridge, self.qs, self.memory_dock, self.data_dir = bridge, qs, memory_dock, data_dir
        self.label = QLabel("Built-in engine")
        self.label.setObjectName("engineStatus")
        self.panel = ServerPanel(window)
        window.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.panel)
        self.panel.hide()
        self._memory_was_visible = True
        self._pending_model: str | None = None  # a model folder to load once the built-in engine is in use
        bridge.serverReport.connect(self.panel.on_server_report)
        bridge.engineChanged.connect(self._on_engine_changed)

    @property
    def remote(self) -> RemoteEngine | None:
        engine = self.bridge.remote
        if engine is not None and not isinstance(engine, RemoteEngine):  # apply() starts the only ones
            raise TypeError(f"the engine in use is neither the built-in one nor a RemoteEngine: {engine!r}")
        return engine

    def load_builtin(self, path: str) -> None:
        """Load a model folder into the built-in engine: now if it is in use, else when it is
        next chosen (a server in use needs no local model taking memory)."""
        if self.remote is None:
            self.bridge.load_model(path)
        else:
            self._pending_model = path
            self.bridge.inject(
                Notice(
                    "info",
                    f"{Path(path).name} will load when the built-in engine is chosen "
                    "(Settings ▸ Engine); replies now come from the server.",
                )
            )

    def apply(self, choice: EngineChoice | None = None) -> None:
        """Use the engine chosen in Settings (read from preferences unless given)."""
        choice = choice if choice is not None else load_choice(self.qs)
        server, old = choice.server, self.remote
        if server is None:
            if old is not None:
                self.bridge.use_engine(self.bridge.builtin)
                self.bridge.drop_engine(old, wait=False)
            if self._pending_model:
                path, self._pending_model = self._pending_model, None
                self.bridge.load_model(path)
            return
        config = server.config()
        if old is not None and old.config == config:
            return
        self.bridge.use_engine(RemoteEngine(config, data_dir=self.data_dir).start())
        if old is not None:
            self.bridge.drop_engine(old, wait=False)

    def _on_engine_changed(self, engine) -> None:
        if engine is self.bridge.builtin:
            self.label.setText("Built-in engine")
            self.label.setToolTip("Replies come from the model loaded on this computer")
            self.panel.hide()
            self.memory_dock.setVisible(self._memory_was_visible)
        else:
            server = engine.config.server.removeprefix("http://")
            self.label.setText(f"Remote: {server}")
            self.label.setToolTip(f"Replies come from the OpenAI-compatible server at {engine.config.shown_url}")
            if self.panel.isHidden():
                self._memory_was_visible = self.memory_dock.isVisible()
            self.memory_dock.hide()
            self.panel.show()
