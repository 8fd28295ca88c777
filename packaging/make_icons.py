"""Render the app icon (resources/icons/parley.svg) to the PNG sizes desktops want, plus
parley.ico (Windows shortcuts, PyInstaller) and parley.icns (the macOS .app).

Outputs are committed under resources/icons/app/; rerun after changing the SVG:
    .venv/bin/python packaging/make_icons.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SVG = ROOT / "resources" / "icons" / "parley.svg"
OUT = ROOT / "resources" / "icons" / "app"
PNG_SIZES = (16, 22, 24, 32, 48, 64, 128, 256, 512)
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)


def render_png(size: int, path: Path) -> None:
    from PySide6.QtCore import QRectF, Qt
    from PySide6.QtGui import QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    renderer = QSvgRenderer(str(SVG))
    if not renderer.isValid():
        raise SystemExit(f"cannot read {SVG}")
    image = QImage(size, size, QImage.Format.Format_ARGB32)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
    renderer.render(painter, QRectF(0, 0, size, size))
    painter.end()
    # PySide6's stub types the format as bytes, but at runtime only a str is taken (b"PNG" raises ValueError)
    if not image.save(str(path), "PNG"):  # type: ignore[call-overload]
        raise SystemExit(f"cannot write {path}")


def main() -> int:
    from PIL import Image

    OUT.mkdir(parents=True, exist_ok=True)
    for size in PNG_SIZES:
        render_png(size, OUT / f"parley-{size}.png")
    images = {s: Image.open(OUT / f"parley-{s}.png").convert("RGBA") for s in PNG_SIZES}
    # Each ICO entry is its own rendering (not a downscale of the largest).
    images[256].save(
        OUT / "parley.ico",
        format="ICO",
        sizes=[(s, s) for s in ICO_SIZES],
        append_images=[images[s] for s in ICO_SIZES if s != 256],
    )
    images[512].save(OUT / "parley.icns", format="ICNS", append_images=[images[s] for s in (16, 32, 64, 128, 256)])
    print(f"wrote {len(PNG_SIZES)} PNGs, parley.ico and parley.icns to {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
