"""The half of the engine protocol both engines share: listeners, one worker thread fed by a
queue of typed requests, turn ids, stop requests and the bookkeeping around one turn.
`Engine` (the built-in model owner) and `RemoteEngine` (an OpenAI-compatible server) add their
requests, their `_loop`, `_handle` and `_run_turn`; both satisfy `EngineLike` (engine/protocol/engine_like.py).

The thread never ends without a word. A request that raises anything (a SystemExit too: a module
imported during a load once called sys.exit) fails alone, as ModelFailed or TurnFailed, and the
loop goes on (`_dispatch`). If the thread ends all the same, its top (`_run`) answers the
request it was handling and every queued one, and every later request is answered at once
(`dead` says why), so no caller (load_blocking, the window's "Loading…") waits forever."""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from .events import Event, ModelFailed, Notice, Turn, TurnDone, TurnFailed, TurnStarted
from .turn_stats import TurnStats

log = logging.getLogger(__name__)


class Listeners:
    """Who hears an engine's events. The engine's parts are given this object's `emit`, not the
    engine's, so none of them holds a reference back to the engine."""

    def __init__(self) -> None:
        self._fns: list[Callable[[Event], None]] = []

    def add(self, fn: Callable[[Event], None]) -> None:
        self._fns.append(fn)

    def remove(self, fn: Callable[[Event], None]) -> None:
        if fn in self._fns:
            self._fns.remove(fn)

    def emit(self, event: Event) -> None:
        for fn in list(self._fns):
            try:
                fn(event)
            except Exception:  # a broken listener must not take the engine down
                log.exception("engine listener failed on %s", type(event).__name__)

    def emit_to_all(self, event: Event) -> None:
        """Every listener hears `event`, whatever another one raises (once the thread has ended)."""
        for fn in list(self._fns):
            try:
                fn(event)
            except BaseException:
                log.exception("engine listener failed on %s", type(event).__name__)


# ------------------------------------------------------------ requests both engines take


@dataclass(frozen=True)
class Request:
    name: ClassVar[str] = "request"  # what a failure notice calls it ("load failed: ...")


@dataclass(frozen=True)
class RunTurn(Request):
    name: ClassVar[str] = "turn"
    turn: Turn
    queued_at: float  # perf_counter when submit() queued it


@dataclass(frozen=True)
class LoadModel(Request):
    name: ClassVar[str] = "load"
    path: str  # a model folder (built-in engine) or a model name on the server ("" = its default)


@dataclass(frozen=True)
class ReportState(Request):
    name: ClassVar[str] = "memory"


@dataclass(frozen=True)
class Shutdown(Request):
    name: ClassVar[str] = "shutdown"


class TurnFailure(Exception):
    """A turn that cannot finish: its one line, and the reply streamed before it failed."""

    def __init__(self, message: str, partial: str = ""):
        super().__init__(message)
        self.message = message
        self.partial = partial


class EngineWorker:
    thread_name = "parley-engine"

    def __init__(self, events: Listeners | None = None) -> None:
        self.events = events or Listeners()
        self.last_turn_stats: TurnStats | None = None  # the latest finished turn's stats
        self._queue: queue.Queue[Request] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._ids = itertools.count(1)
        self._stop_lock = threading.Lock()
        self._stop_requested: set[int] = set()
        self._current_turn: int | None = None
        self._life_lock = threading.Lock()  # orders requests against the thread's end
        self._handling: Request | None = None  # the request being handled now
        self.dead: str | None = None  # why the thread ended, once it has (a shutdown aside)

    # ------------------------------------------------------------ public API (any thread)

    def add_listener(self, fn: Callable[[Event], None]) -> None:
        self.events.add(fn)

    def remove_listener(self, fn: Callable[[Event], None]) -> None:
        self.events.remove(fn)

    def start(self):
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self._thread.start()
        return self

    def new_turn_id(self) -> int:
        return next(self._ids)

    def submit(self, turn: Turn) -> int:
        """Queue a turn; a turn_id already taken from new_turn_id() is kept."""
        if not turn.turn_id:
            turn.turn_id = next(self._ids)
        self._put(RunTurn(turn, time.perf_counter()))
        return turn.turn_id

    def stop(self, turn_id: int | None = None) -> None:
        """Stop the running turn (or a queued one) before its next token."""
        with self._stop_lock:
            target = turn_id if turn_id is not None else self._current_turn
            if target is not None:
                self._stop_requested.add(target)
            running = target is not None and target == self._current_turn
        if running:
            self._stop_running()

    def request_memory_report(self) -> None:
        self._put(ReportState())

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the running turn, let the worker finish what is queued, and wait for it."""
        if self._thread is None:
            return
        self.stop()
        self._put(Shutdown())
        self._thread.join(timeout)
        self._shut_down(finished=not self._thread.is_alive())
        self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------ for the engines

    def _put(self, request: Request) -> None:
        """Queue a request for the worker thread, or answer it at once if the thread has ended."""
        with self._life_lock:
            if self.dead is None:
                self._queue.put(request)
                return
        self._refuse(request, self.dead, self.events.emit_to_all)

    def _dispatch(self, request: Request) -> None:
        """Handle one request on the worker thread; the loop survives anything it raises."""
        self._handling = request
        try:
            self._handle(request)
        except Exception as exc:
            log.exception("engine request %s failed", request.name)
            self._emit(Notice("error", f"{request.name} failed: {exc}"))
        except BaseException as exc:  # SystemExit and the like: this request fails, the engine goes on
            log.error("engine request %s ended by %s: %s", request.name, type(exc).__name__, exc)
            self._refuse(request, f"The {_what(request)} was stopped by {type(exc).__name__}: {exc}", self._emit)
        self._handling = None  # not reached when even the failure could not be said: _run answers it

    def _run(self) -> None:
        """The thread's top: whatever ends `_loop` but a shutdown is said, and answered for."""
        try:
            self._loop()
        except BaseException as exc:
            reason = f"The engine stopped ({type(exc).__name__}: {exc}); restart Parley to use it again."
            log.error("%s thread ended: %s: %s", self.thread_name, type(exc).__name__, exc)
            with self._life_lock:
                self.dead = reason
                waiting = [self._handling] if self._handling is not None else []
                while not self._queue.empty():
                    waiting.append(self._queue.get_nowait())
            for request in waiting:
                self._refuse(request, reason, self.events.emit_to_all)
            self.events.emit_to_all(Notice("error", reason))

    def _refuse(self, request: Request, reason: str, emit: Callable[[Event], None]) -> None:
        """Answer a request that will not be carried out, as its own failure would be."""
        match request:
            case LoadModel(path=path):
                emit(ModelFailed(path, reason))
            case RunTurn(turn=turn):
                emit(TurnFailed(turn.turn_id, turn.conversation_id, reason))

    def _next_request(self, timeout: float | None = None) -> Request | None:
        """The next request, or None when `timeout` passed without one."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def _nothing_waiting(self) -> bool:
        return self._queue.empty()

    def _emit(self, event: Event) -> None:
        self.events.emit(event)

    def _should_stop(self, turn_id: int) -> bool:
        return turn_id in self._stop_requested

    def _do_turn(self, request: RunTurn) -> None:
        """One turn's bookkeeping, the same in both engines: TurnStarted, a turn stopped while
        queued ends at once, then `_run_turn`'s TurnDone, or TurnFailed with one line."""
        turn = request.turn
        tid, cid = turn.turn_id, turn.conversation_id
        with self._stop_lock:
            self._current_turn = tid
        self._emit(TurnStarted(tid, cid))
        try:
            if self._should_stop(tid):
                self._emit(TurnDone(tid, cid, "", [], TurnStats(), stopped=True))
                return
            done = self._run_turn(turn, request.queued_at)
            self.last_turn_stats = done.stats  # set before TurnDone goes out: waiters read it next
            self._emit(done)
            self._turn_done(done)
        except TurnFailure as exc:
            self._turn_failed(turn, exc.message, exc.partial)
        except ValueError as exc:  # PictureError included: a bad turn fails alone
            self._turn_failed(turn, str(exc))
        except Exception as exc:
            log.exception("turn %s failed", tid)
            self._turn_failed(turn, self._failure_line(exc))
        finally:
            with self._stop_lock:
                self._current_turn = None
                self._stop_requested.discard(tid)

    def _turn_failed(self, turn: Turn, message: str, partial: str = "") -> None:
        self._emit(TurnFailed(turn.turn_id, turn.conversation_id, message, partial))

    # ------------------------------------------------------------ what each engine adds

    def _loop(self) -> None:
        """Take requests (`_next_request`) and hand each to `_dispatch` until a Shutdown."""
        raise NotImplementedError

    def _handle(self, request: Request) -> None:
        """Carry out one request (on the worker thread)."""
        raise NotImplementedError

    def _run_turn(self, turn: Turn, queued_at: float) -> TurnDone:
        """Run one turn (on the worker thread), emitting its tokens; raise TurnFailure (or
        ValueError for a bad turn) when it cannot finish."""
        raise NotImplementedError

    def _failure_line(self, exc: Exception) -> str:
        """The line a turn that failed unexpectedly ends with."""
        return f"The turn failed ({type(exc).__name__}: {exc})"

    def _turn_done(self, done: TurnDone) -> None:
        """After TurnDone went out."""

    def _stop_running(self) -> None:
        """A stop for the running turn was asked (any thread): end a wait it is in now, if it can."""

    def _shut_down(self, finished: bool) -> None:
        """After shutdown waited for the worker (`finished`: it ended within the timeout)."""


def _what(request: Request) -> str:
    return {"load": "model load", "turn": "turn"}.get(request.name, f"{request.name} request")
