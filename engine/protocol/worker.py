"""The half of the engine protocol both engines share: listeners, one worker thread fed by a
request queue, turn ids and stop requests. `Engine` (the built-in model owner) and
`RemoteEngine` (an OpenAI-compatible server) add their requests and their `_loop`."""
from __future__ import annotations

import itertools
import logging
import queue
import threading
from typing import Callable

from .events import Event, Turn

log = logging.getLogger(__name__)


class EngineWorker:
    thread_name = "parley-engine"

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._listeners: list[Callable[[Event], None]] = []
        self._thread: threading.Thread | None = None
        self._ids = itertools.count(1)
        self._stop_lock = threading.Lock()
        self._stop_requested: set[int] = set()
        self._current_turn: int | None = None

    def add_listener(self, fn: Callable[[Event], None]) -> None:
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[Event], None]) -> None:
        if fn in self._listeners:
            self._listeners.remove(fn)

    def start(self):
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
            self._thread.start()
        return self

    def new_turn_id(self) -> int:
        return next(self._ids)

    def submit(self, turn: Turn) -> int:
        """Queue a turn; a turn_id already taken from new_turn_id() is kept."""
        if not turn.turn_id:
            turn.turn_id = next(self._ids)
        self._queue.put(("turn", turn))
        return turn.turn_id

    def stop(self, turn_id: int | None = None) -> None:
        """Stop the running turn (or a queued one) before its next token."""
        with self._stop_lock:
            target = turn_id if turn_id is not None else self._current_turn
            if target is not None:
                self._stop_requested.add(target)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _emit(self, event: Event) -> None:
        for fn in list(self._listeners):
            try:
                fn(event)
            except Exception:  # a broken listener must not take the engine down
                log.exception("engine listener failed on %s", type(event).__name__)

    def _loop(self) -> None:
        raise NotImplementedError
