"""Reading a dropped PDF or video off the UI thread.

Attaching one hashes the whole file, probes it (PDFium, PyAV), copies it into the history's
store and renders its first page or frame: seconds for a large clip, which on the UI thread
froze the window. So each read runs on the thread pool (as thumbnails do, app/composer/thumbnails.py) and
its result comes back to the UI thread as one `finished` signal. A read whose chip was removed
is cancelled: it stops before the copy when it can, and its result is dropped either way.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, QRunnable, Qt, QThreadPool, Signal, SignalInstance

from .picture_intake import Attachment, PictureIntake, PictureRejected, ReadCancelled


@dataclass(frozen=True)
class MediaRead:
    """One read's outcome: the attachment, or one sentence saying why the file cannot be used."""

    token: int
    name: str
    attachment: Attachment | None
    error: str = ""


class _Read(QRunnable):
    def __init__(self, token: int, path: Path, intake: PictureIntake, cancelled: threading.Event, done: SignalInstance):
        super().__init__()
        self.token, self.path, self.intake, self.cancelled, self.done = token, path, intake, cancelled, done

    def run(self) -> None:  # a pool thread: no widgets here (the thumbnail is a QImage)
        name = self.path.name or str(self.path)
        try:
            result = MediaRead(self.token, name, self.intake.from_media(self.path, self.cancelled))
        except ReadCancelled:
            result = MediaRead(self.token, name, None)
        except PictureRejected as exc:
            result = MediaRead(self.token, name, None, str(exc))
        except Exception as exc:  # never leave a chip reading forever
            result = MediaRead(self.token, name, None, f"{name} cannot be read ({exc})")
        try:
            self.done.emit(result)
        except RuntimeError:  # the composer went away with its window meanwhile
            pass


class MediaReader(QObject):
    finished = Signal(object)  # MediaRead, on the UI thread; never for a cancelled read
    _done = Signal(object)

    def __init__(self, intake: PictureIntake, parent: QObject | None = None):
        super().__init__(parent)
        self.intake = intake
        self.pool = QThreadPool.globalInstance()
        self._tokens = itertools.count(1)
        self._running: dict[int, threading.Event] = {}  # token -> its cancel flag
        self._done.connect(self._on_done, Qt.ConnectionType.QueuedConnection)

    def start(self, path: Path) -> int:
        """Begin reading `path`; the token names it in `finished` and `cancel`."""
        token = next(self._tokens)
        cancelled = threading.Event()
        self._running[token] = cancelled
        self.pool.start(_Read(token, path, self.intake, cancelled, self._done))
        return token

    def cancel(self, token: int) -> None:
        flag = self._running.get(token)
        if flag is not None:
            flag.set()

    def in_flight(self) -> int:
        """Reads not yet back on the UI thread, cancelled ones included."""
        return len(self._running)

    def _on_done(self, result: MediaRead) -> None:
        flag = self._running.pop(result.token, None)
        if flag is not None and not flag.is_set():
            self.finished.emit(result)
