"""The one place Qt meets the engine: engine events (on engine threads) -> Qt signals (UI thread).

The engine calls our listener on its own threads. The listener only appends to a queue under a
lock and, at most once per batch, posts a wake-up (app.worker.Wake) to the UI thread. Token events are
merged while they wait and delivered at most every `flush_ms`, so a model producing thousands
of tokens a second costs the UI thread ~30 deliveries a second. Any other event is delivered
at once, after the tokens queued before it, so order is kept.

Two engines may sit behind it: the built-in one (always there: the API server uses it too) and
a remote one (a server). Turn events of either reach the window (a reply started before a
switch still finishes); model, memory and notice events only from the engine in use.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal, Slot

from engine.local.engine import Engine
from engine.protocol.engine_like import EngineLike
from engine.protocol.events import (
    ChatMemoryReport,
    EncoderState,
    Event,
    MemoryReport,
    ModelFailed,
    ModelLoading,
    ModelReady,
    Notice,
    PictureMarks,
    ServerReport,
    SpillState,
    Token,
    Turn,
    TurnDone,
    TurnFailed,
    TurnStarted,
)
from engine.protocol.settings import EngineSettings

from ..worker import Wake, Worker

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
    chatMemory = Signal(object)  # ChatMemoryReport: where each conversation's KV is
    pictureMarks = Signal(object)  # PictureMarks: which pictures are encoded and cached
    notice = Signal(object)  # Notice
    serverReport = Signal(object)  # ServerReport (a remote engine)
    engineChanged = Signal(object)  # the engine now in use

    def __init__(self, engine: Engine, flush_ms: int = FLUSH_MS, parent: QObject | None = None):
        super().__init__(parent)
        self.builtin = engine  # loads model folders; the API server shares it
        self.engine: EngineLike = engine  # the engine turns go to (the built-in one or a remote one)
        self._model_events: dict[int, Event] = {}  # id(engine) -> its last ModelReady / ModelFailed
        self._listeners: dict[int, Callable[[Event], None]] = {}
        self._turn_engines: dict[int, EngineLike] = {}  # turn id -> the engine running it, until it ends
        self._lock = threading.Lock()
        self._pending: list[object] = []
        self._wake_posted = False
        self._urgent = False
        self._closed = False
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(flush_ms)
        self._timer.timeout.connect(self._drain)
        self._wake = Wake(self._on_wake, self)
        # a remote engine no longer in use is shut down here (a hung server must not freeze the
        # window); enough threads that a close never waits behind another
        self._closer = Worker("parley-remote-close", threads=4, parent=self)
        self._listen(engine)

    @classmethod
    def create(
        cls,
        settings: EngineSettings | None = None,
        data_dir: Path | None = None,
        parent: QObject | None = None,
        start: bool = True,
    ) -> EngineBridge:
        """An Engine wrapped in a bridge, started unless `start=False` (then `start()` it later:
        requests made before wait in its queue)."""
        bridge = cls(Engine(settings, data_dir), parent=parent)
        if start:
            bridge.start()
        return bridge

    def start(self) -> None:
        """Start the built-in engine's thread, which imports torch (seconds) on its own."""
        self.builtin.start()

    # ------------------------------------------------------------ calls into the engine

    def _listen(self, engine: EngineLike) -> None:
        def fn(ev: Event, src: EngineLike = engine) -> None:
            self._on_engine_event(ev, src)

        with self._lock:
            self._listeners[id(engine)] = fn
        engine.add_listener(fn)

    def use_engine(self, engine: EngineLike) -> None:
        """Send turns to `engine` from now on (the built-in one or a started RemoteEngine).
        The window hears the new engine's model state at once: its last ModelReady/ModelFailed
        if it had one, else the engine is asked to connect."""
        if engine is self.engine:
            return
        with self._lock:
            known = id(engine) in self._listeners
        if not known:
            self._listen(engine)
        with self._lock:
            self.engine = engine
            last = self._model_events.get(id(engine))
        self.engineChanged.emit(engine)
        if last is not None:
            self._on_engine_event(last, engine)
        elif engine is not self.builtin:
            engine.load_model("")
        self.engine.request_memory_report()

    def drop_engine(self, engine: EngineLike, timeout: float = 30.0, wait: bool = True) -> None:
        """Shut down a remote engine no longer in use (never the built-in one); `wait=False`
        does it on a Worker's thread, so a hung server never freezes the window."""
        if engine is self.builtin or engine is self.engine:
            return

        def finish():
            engine.shutdown(timeout)  # first: a reply it was streaming ends (stopped) and is heard
            with self._lock:
                fn = self._listeners.pop(id(engine), None)
                self._model_events.pop(id(engine), None)
            if fn is not None:
                engine.remove_listener(fn)

        if wait:
            finish()
        else:
            self._closer.submit(lambda _job: finish())

    def load_model(self, path: str) -> None:
        self.builtin.load_model(str(path))
        # said now, not when the owner thread reaches the request: at launch that thread is still
        # importing torch (seconds), and the window would say "No model loaded" meanwhile
        self.inject(ModelLoading(str(path)))

    def submit(self, turn: Turn) -> int:
        # ids come from the built-in engine whichever engine runs the turn: they stay unique
        # among the window's turns and the API server's
        if not turn.turn_id:
            turn.turn_id = self.builtin.new_turn_id()
        with self._lock:
            self._turn_engines[turn.turn_id] = self.engine
        return self.engine.submit(turn)

    def stop(self, turn_id: int | None = None) -> None:
        with self._lock:  # the engine that runs it: the turn may have started before a switch
            engine = self._turn_engines.get(turn_id, self.engine) if turn_id is not None else self.engine
        engine.stop(turn_id)

    def request_memory_report(self) -> None:
        self.engine.request_memory_report()

    def unload_encoder(self) -> None:
        self.engine.unload_encoder()

    def spill_now(self, conversation_id: str) -> None:
        self.engine.spill_now(conversation_id)

    def open_chat(self, conversation_id: str | None) -> None:
        """The chat the window shows: the built-in engine restores its KV from the SSD ahead of
        its next turn (a server keeps its own caches: nothing to do there)."""
        if self.engine is self.builtin:
            self.builtin.open_chat(conversation_id)

    def check_pictures(self, refs: list, draft: bool = False) -> None:
        """Ask which of these pictures are encoded and cached (PictureMarks comes back); `draft`:
        they are in the message being written, so an encoder they need may start loading."""
        if self.engine is self.builtin and refs:
            self.builtin.check_pictures(list(refs), draft)

    def forget(self, conversation_id: str) -> None:
        self.builtin.forget(conversation_id)

    def update_settings(self, **changes) -> None:
        if changes:
            self.builtin.update_settings(**changes)

    def engine_settings(self) -> EngineSettings:
        return self.builtin.settings

    @property
    def remote(self) -> EngineLike | None:
        """The remote engine in use, or None with the built-in one."""
        return None if self.engine is self.builtin else self.engine

    @staticmethod
    def check_model_folder(path: str | Path) -> str | None:
        """Why a folder cannot be loaded (the engine's own sentence), or None if it looks fine.
        Torch-free: it never waits for the engine thread's import of torch."""
        from engine.model.folder_check import ModelLoadError, check_folder

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
        remote = self.remote
        if remote is not None:
            remote.remove_listener(self._listeners.pop(id(remote)))
            remote.shutdown(timeout)
        self.builtin.remove_listener(self._listeners.pop(id(self.builtin)))
        self.builtin.shutdown(timeout)

    def inject(self, event: Event) -> None:
        """Deliver an event as if the engine had sent it (used for app-side notices)."""
        self._on_engine_event(event, self.engine)

    # ------------------------------------------------------------ engine threads

    def _on_engine_event(self, event: Event, source: EngineLike | None = None) -> None:
        with self._lock:
            if self._closed:
                return
            if isinstance(event, (ModelReady, ModelFailed)):
                self._model_events[id(source)] = event
            turn_event = isinstance(event, (TurnStarted, Token, TurnDone, TurnFailed))
            if isinstance(event, (TurnDone, TurnFailed)):
                self._turn_engines.pop(event.turn_id, None)
            if not turn_event and source is not None and source is not self.engine:
                return  # the other engine's model and memory news are not what the window shows
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
            self._wake.post()

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
        if isinstance(item, TurnDone) and item.pictures:  # the marks come with the turn's end: no second request
            self.pictureMarks.emit(PictureMarks(item.pictures))
        signal = {
            ModelLoading: self.modelLoading,
            ModelReady: self.modelReady,
            ModelFailed: self.modelFailed,
            TurnStarted: self.turnStarted,
            TurnDone: self.turnDone,
            TurnFailed: self.turnFailed,
            MemoryReport: self.memoryReport,
            EncoderState: self.encoderState,
            SpillState: self.spillState,
            Notice: self.notice,
            ServerReport: self.serverReport,
            ChatMemoryReport: self.chatMemory,
            PictureMarks: self.pictureMarks,
        }.get(type(item))
        if signal is not None:
            signal.emit(item)
