"""Small pixmaps of pictures, decoded off the UI thread at thumbnail size and kept in an LRU.

Decoding a 12-megapixel photo takes tens of milliseconds; done while painting, every picture
scrolling into view would hitch the list. So a miss starts a decode on an app.worker Worker
and paints a placeholder; `ready` asks the view to repaint when the pixmap exists.
"""

from __future__ import annotations

import io
from collections import OrderedDict

from PySide6.QtCore import QObject, QSize, Qt, QThread, Signal
from PySide6.QtGui import QImage, QImageReader, QPixmap

from engine.pictures import parts
from engine.pictures.file import PictureError

from ..worker import Worker


def read_scaled(path: str, box: int) -> QImage:
    """Decode `path` scaled to fit `box` x `box` (EXIF rotation applied); null image on failure.
    A page or frame (`file#fragment`, engine/pictures/parts.py) is rendered or decoded at that size."""
    if "#" in path:
        return _part_scaled(path, box)
    reader = QImageReader(path)
    reader.setAutoTransform(True)
    size = reader.size()
    if size.isValid() and (size.width() > box or size.height() > box):
        reader.setScaledSize(size.scaled(QSize(box, box), Qt.AspectRatioMode.KeepAspectRatio))
    img = reader.read()
    if not img.isNull() and (img.width() > box or img.height() > box):
        img = img.scaled(box, box, Qt.AspectRatioMode.KeepAspectRatio, Qt.TransformationMode.SmoothTransformation)
    return img


def _part_scaled(source: str, box: int) -> QImage:
    try:
        image = parts.preview(source, box)
    except (PictureError, ValueError, OSError):
        return QImage()
    buf = io.BytesIO()
    image.save(buf, "PNG")
    # the stubs type format as bytes, but PySide6 6.12 rejects b"PNG" at runtime and takes a str
    return QImage.fromData(buf.getvalue(), "PNG")  # type: ignore[arg-type]


class ThumbnailCache(QObject):
    ready = Signal()  # a thumbnail finished decoding: repaint

    def __init__(self, capacity: int = 256, parent: QObject | None = None):
        super().__init__(parent)
        self._cache: OrderedDict[tuple, QPixmap] = OrderedDict()
        self._pending: set[tuple] = set()
        self.capacity = capacity
        self.work = Worker("thumbnails", threads=QThread.idealThreadCount(), parent=self)

    def get(self, path: str, box: int, dpr: float = 1.0) -> QPixmap | None:
        """The pixmap if decoded (a null pixmap if the file is unreadable); None while decoding."""
        key = (path, box, dpr)
        pm = self._cache.get(key)
        if pm is not None:
            self._cache.move_to_end(key)
            return pm
        if key not in self._pending:
            self._pending.add(key)
            # a worker thread: QImage (not QPixmap) is safe there
            self.work.submit(
                lambda _job: read_scaled(path, int(box * dpr)), on_done=lambda img: self._on_decoded(key, img)
            )
        return None

    def _on_decoded(self, key: tuple, img: QImage) -> None:
        self._pending.discard(key)
        self._store(key, img)
        self.ready.emit()

    def _store(self, key: tuple, img: QImage) -> None:
        pm = QPixmap.fromImage(img) if not img.isNull() else QPixmap()
        if not pm.isNull():
            pm.setDevicePixelRatio(key[2])
        self._cache[key] = pm
        if len(self._cache) > self.capacity:
            self._cache.popitem(last=False)
