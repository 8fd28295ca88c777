"""The one place Qt meets the engine: engine events (on engine threads) -> Qt signals (UI thread).

The engine calls our listener on its own threads. The listener only appends to a queue under a
lock and, at most once per batch, posts a queued wake-up to the UI thread. Token events are
merged while they wait and delivered at most every `flush_ms`, so a model producing thousands
of tokens a second costs the UI thread ~30 deliveries a second. Any other event is delivered
at once, after the tokens queued before it, so order is kept.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, Qt, QTimer, Signal, Slot

from engine.engine import Engine
from engine.events import (
    EncoderState, Event, MemoryReport, ModelFailed, ModelLoading, ModelReady, Notice, SpillState,
    Token, Turn, TurnDone, TurnFailed, TurnStarted,
)
from engine.settings import EngineSettings

FLUSH_MS = 33


@dataclass
class _TokenRun:
    turn_id: int
    conversation_id: str
    parts: list[str] = field(default_factory=list)
    count: int = 0


class EngineBridge(QObject):
    modelLoading = Signal(object)  # ModelLoading
    modelReady = Signal(object)  # ModelReady
    modelFailed = Signal(object)  # ModelFailed
    turnStarted = Signal(object)  # TurnStarted
    tokens = Signal(int, str, str, int)  # turn_id, conversation_id, text, how many tokens
    turnDone = Signal(object)  # TurnDone
    turnFailed = Signal(object)  # TurnFailed
    memoryReport = Signal(object)  # MemoryReport
    encoderState = Signal(object)  # EncoderState
    spillState = Signal(object)  # SpillState
    notice = Signal(object)  # Notice
    _wake = Signal()

    def __init__(self, engine: Engine, flush_ms: int = FLUSH_MS, parent: QObject | None = None):
        super().__init__(parent)
        self.engine = engine
        self._lock = threading.Lock()
        self._pending: list[object] = []
        self._wake_posted = False
        self._urgent = False
        self._closed = False
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(flush_ms)
        self._timer.timeout.connect(self._drain)
        self._wake.connect(self._on_wake, Qt.ConnectionType.QueuedConnection)
        engine.add_listener(self._on_engine_event)

    @classmethod
    def create(cls, settings: EngineSettings | None = None, data_dir: Path | None = None,
               parent: QObject | None = None) -> "EngineBridge":
        """A started Engine wrapped in a bridge."""
        bridge = cls(Engine(settings, data_dir), parent=parent)
        bridge.engine.start()
        return bridge

    # ------------------------------------------------------------ calls into the engine

    def load_model(self, path: str) -> None:
        self.engine.load_model(str(path))

    def submit(self, turn: Turn) -> int:
        return self.engine.submit(turn)

    def stop(self, turn_id: int | None = None) -> None:
        self.engine.stop(turn_id)

    def request_memory_report(self) -> None:
        self.engine.request_memory_report()

    def unload_encoder(self) -> None:
        self.engine.unload_encoder()

    def spill_now(self, conversation_id: str) -> None:
        self.engine.spill_now(conversation_id)

    def forget(self, conversation_id: str) -> None:
        self.engine.forget(conversation_id)

    def update_settings(self, **changes) -> None:
        if changes:
            self.engine.update_settings(**changes)

    def engine_settings(self) -> EngineSettings:
        return self.engine.settings

    @staticmethod
    def check_model_folder(path: str | Path) -> str | None:
        """Why a folder cannot be loaded (the engine's own sentence), or None if it looks fine."""
        from engine.model import ModelLoadError, check_folder
        try:
            check_folder(Path(path).expanduser())
        except ModelLoadError as exc:
            return str(exc)
        return None

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the engine; events still in flight are dropped."""
        with self._lock:
            self._closed = True
            self._pending.clear()
        self._timer.stop()
        self.engine.remove_listener(self._on_engine_event)
        self.engine.shutdown(timeout)

    def inject(self, event: Event) -> None:
        """Deliver an event as if the engine had sent it (used for app-side notices)."""
        self._on_engine_event(event)

    # ------------------------------------------------------------ engine threads

    def _on_engine_event(self, event: Event) -> None:
        with self._lock:
            if self._closed:
                return
            if isinstance(event, Token):
                last = self._pending[-1] if self._pending else None
                if not (isinstance(last, _TokenRun) and last.turn_id == event.turn_id):
                    last = _TokenRun(event.turn_id, event.conversation_id)
                    self._pending.append(last)
                last.parts.append(event.text)
                last.count += 1
                urgent = False
            else:
                self._pending.append(event)
                urgent = True
            post = not self._wake_posted or (urgent and not self._urgent)
            self._wake_posted = True
            self._urgent = self._urgent or urgent
        if post:
            self._wake.emit()

    # ------------------------------------------------------------ UI thread

    @Slot()
    def _on_wake(self) -> None:
        with self._lock:
            urgent = self._urgent
        if urgent:
            self._drain()
        elif not self._timer.isActive():
            self._timer.start()

    @Slot()
    def _drain(self) -> None:
        self._timer.stop()
        with self._lock:
            items, self._pending = self._pending, []
            self._wake_posted = False
            self._urgent = False
        for item in items:
            self._deliver(item)

    def _deliver(self, item: object) -> None:
        if isinstance(item, _TokenRun):
            self.tokens.emit(item.turn_id, item.conversation_id, "".join(item.parts), item.count)
            return
        signal = {
            ModelLoading: self.modelLoading, ModelReady: self.modelReady,
            ModelFailed: self.modelFailed, TurnStarted: self.turnStarted,
            TurnDone: self.turnDone, TurnFailed: self.turnFailed,
            MemoryReport: self.memoryReport, EncoderState: self.encoderState,
            SpillState: self.spillState, Notice: self.notice,
        }.get(type(item))
        if signal is not None:
            signal.emit(item)
