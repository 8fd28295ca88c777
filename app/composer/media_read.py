"""Reading a dropped PDF or video off the UI thread.

Attaching one hashes the whole file, probes it (PDFium, PyAV), copies it into the history's
store and renders its first page or frame: seconds for a large clip, which on the UI thread
froze the window. So each read runs on an app.worker Worker (as thumbnails do,
app/composer/thumbnails.py) and its result comes back to the UI thread as one `finished` signal.
A read whose chip was removed is cancelled: it stops before the copy when it can, and its result
is dropped either way.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, QThread, Signal

from ..worker import Worker
from .picture_intake import Attachment, PictureIntake, PictureRejected, ReadCancelled


@dataclass(frozen=True)
class MediaRead:
    """One read's outcome: the attachment, or one sentence saying why the file cannot be used."""

    token: int
    name: str
    attachment: Attachment | None
    error: str = ""


def _read(token: int, path: Path, intake: PictureIntake, cancelled: threading.Event) -> MediaRead:
    """A worker thread: no widgets here (the thumbnail is a QImage)."""
    name = path.name or str(path)
    try:
        return MediaRead(token, name, intake.from_media(path, cancelled))
    except ReadCancelled:
        return MediaRead(token, name, None)
    except PictureRejected as exc:
        return MediaRead(token, name, None, str(exc))
    except Exception as exc:  # never leave a chip reading forever
        return MediaRead(token, name, None, f"{name} cannot be read ({exc})")


class MediaReader(QObject):
    finished = Signal(object)  # MediaRead, on the UI thread; never for a cancelled read

    def __init__(self, intake: PictureIntake, parent: QObject | None = None):
        super().__init__(parent)
        self.intake = intake
        self.work = Worker("media-read", threads=QThread.idealThreadCount(), parent=self)
        self._tokens = itertools.count(1)
        # token -> its cancel flag; not the Job's own: a cancelled read still comes back, so that
        # in_flight() counts it until its thread has let go of the file
        self._running: dict[int, threading.Event] = {}

    def start(self, path: Path) -> int:
        """Begin reading `path`; the token names it in `finished` and `cancel`."""
        token = next(self._tokens)
        cancelled = threading.Event()
        self._running[token] = cancelled
        intake = self.intake
        self.work.submit(lambda _job: _read(token, path, intake, cancelled), on_done=self._on_done)
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
