"""Small pixmaps of pictures, decoded once at thumbnail size and kept in an LRU."""
from __future__ import annotations

from collections import OrderedDict

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QImage, QImageReader, QPixmap


def read_scaled(path: str, box: int) -> QImage:
    """Decode `path` scaled to fit `box` x `box` (EXIF rotation applied); null image on failure."""
    reader = QImageReader(path)
    reader.setAutoTransform(True)
    size = reader.size()
    if size.isValid() and (size.width() > box or size.height() > box):
        reader.setScaledSize(size.scaled(QSize(box, box), Qt.AspectRatioMode.KeepAspectRatio))
    img = reader.read()
    if not img.isNull() and (img.width() > box or img.height() > box):
        img = img.scaled(box, box, Qt.AspectRatioMode.KeepAspectRatio,
                         Qt.TransformationMode.SmoothTransformation)
    return img


class ThumbnailCache:
    def __init__(self, capacity: int = 256):
        self._cache: OrderedDict[tuple[str, int, float], QPixmap] = OrderedDict()
        self.capacity = capacity

    def get(self, path: str, box: int, dpr: float = 1.0) -> QPixmap:
        key = (path, box, dpr)
        pm = self._cache.get(key)
        if pm is not None:
            self._cache.move_to_end(key)
            return pm
        img = read_scaled(path, int(box * dpr))
        pm = QPixmap.fromImage(img) if not img.isNull() else QPixmap()
        if not pm.isNull():
            pm.setDevicePixelRatio(dpr)
        self._cache[key] = pm
        if len(self._cache) > self.capacity:
            self._cache.popitem(last=False)
        return pm

    def put_image(self, path: str, box: int, img: QImage, dpr: float = 1.0) -> None:
        pm = QPixmap.fromImage(img)
        pm.setDevicePixelRatio(dpr)
        self._cache[(path, box, dpr)] = pm
