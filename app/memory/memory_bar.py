"""A horizontal bar of device memory: one coloured segment per component, then other use, then free."""

from __future__ import annotations

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPalette
from PySide6.QtWidgets import QSizePolicy, QWidget

from ..sizes import exact_bytes

COLORS = {
    "language_model": "#4f7cff",
    "vision_encoder": "#a259d9",
    "hot_kv": "#2fb171",
    "image_cache_ram": "#f0a030",
    "processor": "#8a8f99",
    "kernels": "#6b7280",
    "hot_kv#0": "#2fb171",  # one shade per conversation, alternating
    "hot_kv#1": "#5fd197",
    "hot_kv#2": "#1f8a55",
}
_SPARE = ["#e0566b", "#23a8c9", "#b5a020", "#8a6d5a", "#5a8a6d"]


def color_for(key: str) -> QColor:
    key = key.split(":", 1)[0]  # "hot_kv#1:<conversation>" takes its shade's colour
    if key in COLORS:
        return QColor(COLORS[key])
    return QColor(_SPARE[sum(map(ord, key)) % len(_SPARE)])


class MemoryBar(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.segments: list[tuple[str, int]] = []
        self.names: dict[str, str] = {}  # key -> label for the tooltip
        self.total = 0
        self.free = 0
        self.setMinimumHeight(22)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:
        return QSize(240, 22)

    def set_values(self, segments: list[tuple[str, int]], total: int, free: int) -> None:
        if (segments, total, free) == (self.segments, self.total, self.free):
            return
        self.segments, self.total, self.free = list(segments), int(total), int(free)
        ours = sum(b for _, b in segments)
        other = max(0, total - free - ours)
        self.setToolTip(
            "\n".join(
                [f"{self.names.get(k, k)}: {exact_bytes(b)}" for k, b in segments]
                + [f"other use: {exact_bytes(other)}", f"free: {exact_bytes(free)}"]
            )
        )
        self.update()

    def paintEvent(self, _event) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        r = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        pal = self.palette()
        p.setPen(pal.color(QPalette.ColorRole.Mid))
        p.setBrush(pal.color(QPalette.ColorRole.Base))
        p.drawRoundedRect(r, 4, 4)
        if self.total <= 0:
            return
        inner = r.adjusted(1, 1, -1, -1)
        scale = inner.width() / self.total
        x = inner.left()
        p.setPen(Qt.PenStyle.NoPen)
        for key, b in self.segments:
            if b <= 0:
                continue
            w = max(2.0, b * scale)  # tiny components stay visible
            p.setBrush(color_for(key))
            p.drawRect(QRectF(x, inner.top(), w, inner.height()))
            x += w
        ours = sum(b for _, b in self.segments)
        other = max(0, self.total - self.free - ours)
        if other > 0:
            c = pal.color(QPalette.ColorRole.Text)
            c.setAlpha(60)
            p.setBrush(c)
            p.drawRect(QRectF(x, inner.top(), min(other * scale, inner.right() - x), inner.height()))
        p.end()
