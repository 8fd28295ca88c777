"""The one way app/ brings work back to the UI thread: a `Worker` for a function run off it, a
`Wake` for news that other threads (the engine's, the API server's) have for it.

A Worker runs the functions handed to `submit` on its own daemon threads (at most `threads` at
once, in the order submitted) and delivers what each one returned, or raised, on the UI thread.

Threading contract:
- `submit`, `Job.cancel` and `wait_idle` are called on the UI thread (the thread the Worker lives
  in). The function runs on a worker thread and gets its `Job`: it must not touch widgets (a
  QImage is fine, a QPixmap is not); it may call `job.report(value)` any number of times and may
  poll `job.cancelled` (a threading.Event) to stop early.
- `on_report(value)`, then exactly one of `on_done(result)` / `on_error(exception)`, run on the UI
  thread from its event loop (never inside `submit`), in the order the worker thread produced them.
  An exception without `on_error` is logged, never silent.
- A cancelled job delivers nothing more, whatever its function still does; one cancelled before
  it starts never runs. A Worker that is deleted (with its parent: a closed page) delivers nothing
  and starts no queued job; a function already running finishes on its daemon thread unheard.
- `Wake.post()` may be called on any thread, any number of times; the Wake's callback then runs
  on the UI thread, once for all the posts made before it starts (posts made while it runs bring
  one more call). The caller keeps what the callback should read under its own lock. A deleted
  Wake ignores posts.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal, Slot

log = logging.getLogger(__name__)


class Job:
    """One submitted function: its cancel flag, its reports, and (once run) its outcome."""

    def __init__(
        self,
        fn: Callable[[Job], Any],
        on_done: Callable[[Any], None] | None,
        on_error: Callable[[BaseException], None] | None,
        on_report: Callable[[Any], None] | None,
        post_report: Callable[[Job, Any], None],
    ):
        self.fn, self.on_done, self.on_error, self.on_report = fn, on_done, on_error, on_report
        self.cancelled = threading.Event()
        self._post_report = post_report
        self.result: Any = None
        self.error: BaseException | None = None

    def cancel(self) -> None:
        """Nothing more of this job reaches the UI thread (its function may still be running)."""
        self.cancelled.set()

    def report(self, value: Any) -> None:
        """From the job's function: hand `value` to `on_report` on the UI thread."""
        if not self.cancelled.is_set():
            self._post_report(self, value)


class Worker(QObject):
    """Runs functions off the UI thread and delivers their results on it (see the module)."""

    _finished = Signal(object)  # a Job whose function returned or raised
    _reported = Signal(object, object)  # a Job, one value it reported

    def __init__(self, name: str, threads: int = 1, parent: QObject | None = None):
        super().__init__(parent)
        self.name, self.threads = name, threads
        self._lock = threading.Condition()
        self._queue: deque[Job] = deque()
        self._running = 0  # threads alive (each takes jobs until the queue is empty)
        self._busy = 0  # jobs queued or running
        self._gone = threading.Event()  # the Qt object is deleted: start nothing more
        gone = self._gone  # not self: the lambda must not keep the Python wrapper alive
        self.destroyed.connect(lambda *_: gone.set())
        self._finished.connect(self._deliver, Qt.ConnectionType.QueuedConnection)
        self._reported.connect(self._deliver_report, Qt.ConnectionType.QueuedConnection)

    def submit(
        self,
        fn: Callable[[Job], Any],
        on_done: Callable[[Any], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        on_report: Callable[[Any], None] | None = None,
    ) -> Job:
        job = Job(fn, on_done, on_error, on_report, self._post_report)
        with self._lock:
            self._queue.append(job)
            self._busy += 1
            start = self._running < self.threads
            if start:
                self._running += 1
        if start:
            threading.Thread(target=self._run, name=self.name, daemon=True).start()
        return job

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Wait until no job is queued or running; True when none is. Results may still be on
        their way to the UI thread (its event loop delivers them)."""
        with self._lock:
            return self._lock.wait_for(lambda: self._busy == 0, timeout_s)

    # ------------------------------------------------------------ worker threads

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._gone.is_set():  # its page is closed: the queued jobs are not wanted
                    self._busy -= len(self._queue)
                    self._queue.clear()
                if not self._queue:
                    self._running -= 1
                    self._lock.notify_all()
                    return
                job = self._queue.popleft()
            try:
                if not job.cancelled.is_set():
                    try:
                        job.result = job.fn(job)
                    except Exception as exc:  # delivered to on_error (or logged) on the UI thread
                        job.error = exc
                    self._emit(self._finished, job)
            finally:
                with self._lock:
                    self._busy -= 1
                    self._lock.notify_all()

    def _post_report(self, job: Job, value: Any) -> None:
        self._emit(self._reported, job, value)

    def _emit(self, signal, *args) -> None:
        if self._gone.is_set():
            return
        try:
            signal.emit(*args)
        except RuntimeError:  # the Worker was deleted (with its page) while the job ran
            self._gone.set()

    # ------------------------------------------------------------ UI thread

    @Slot(object)
    def _deliver(self, job: Job) -> None:
        if job.cancelled.is_set():
            return
        if job.error is None:
            if job.on_done is not None:
                job.on_done(job.result)
        elif job.on_error is not None:
            job.on_error(job.error)
        else:
            log.error("%s: a background job failed", self.name, exc_info=job.error)

    @Slot(object, object)
    def _deliver_report(self, job: Job, value: Any) -> None:
        if not job.cancelled.is_set() and job.on_report is not None:
            job.on_report(value)


class Wake(QObject):
    """A coalescing wake-up of the UI thread from any thread (see the module's contract)."""

    _posted = Signal()

    def __init__(self, callback: Callable[[], None], parent: QObject | None = None):
        super().__init__(parent)
        self._callback = callback
        self._lock = threading.Lock()
        self._pending = False  # a call is queued and has not started yet
        self._posted.connect(self._run, Qt.ConnectionType.QueuedConnection)

    def post(self) -> None:
        with self._lock:
            if self._pending:
                return
            self._pending = True
        try:
            self._posted.emit()
        except RuntimeError:  # deleted with its owner: nobody is left to tell
            pass

    @Slot()
    def _run(self) -> None:
        with self._lock:
            self._pending = False  # first: news posted while the callback runs brings another call
        self._callback()
