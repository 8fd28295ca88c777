"""Icons from resources/icons, drawn in the current text colour so they suit light and dark."""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path

from PySide6.QtCore import QByteArray, QRectF, Qt
from PySide6.QtGui import QGuiApplication, QIcon, QPainter, QPalette, QPixmap
from PySide6.QtSvg import QSvgRenderer


def resources_dir() -> Path:
    bundled = getattr(sys, "_MEIPASS", None)  # PyInstaller unpacks data files here
    root = Path(bundled) if bundled else Path(__file__).resolve().parents[1]
    return root / "resources"


def icon_path(name: str) -> Path:
    return resources_dir() / "icons" / f"{name}.svg"


def app_icon() -> QIcon:
    """The app icon: pre-rendered PNGs (crisp at 16 px, no SVG plugin needed), else the SVG."""
    pngs = sorted((resources_dir() / "icons" / "app").glob("parley-*.png"))
    if not pngs:
        return QIcon(str(icon_path("parley")))
    out = QIcon()
    for png in pngs:
        out.addFile(str(png))
    return out


def icon(name: str) -> QIcon:
    pal = QGuiApplication.palette()
    return _tinted(
        name, pal.color(QPalette.ColorRole.WindowText).name(), pal.color(QPalette.ColorRole.PlaceholderText).name()
    )


def clear_icon_cache() -> None:
    _tinted.cache_clear()


@lru_cache(maxsize=64)
def _tinted(name: str, color: str, disabled_color: str) -> QIcon:
    svg = icon_path(name).read_text(encoding="utf-8")
    out = QIcon()
    for mode, c in ((QIcon.Mode.Normal, color), (QIcon.Mode.Disabled, disabled_color)):
        renderer = QSvgRenderer(QByteArray(svg.replace("currentColor", c).encode()))
        for size in (16, 20, 24, 32, 48):
            pm = QPixmap(size, size)
            pm.fill(Qt.GlobalColor.transparent)
            p = QPainter(pm)
            renderer.render(p, QRectF(0, 0, size, size))
            p.end()
            out.addPixmap(pm, mode)
    return out
