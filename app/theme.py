"""Light / dark: follow the system by default; a preference can force either.

Widgets take their colours from the palette (the message delegate and resources/theme.qss
both do), so switching the palette is all a theme change needs.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication, QStyleFactory

from .icons import clear_icon_cache, resources_dir


def dark_palette() -> QPalette:
    p = QPalette()
    c = {
        QPalette.ColorRole.Window: "#202124",
        QPalette.ColorRole.WindowText: "#e8e8ea",
        QPalette.ColorRole.Base: "#17181a",
        QPalette.ColorRole.AlternateBase: "#26282b",
        QPalette.ColorRole.Text: "#e8e8ea",
        QPalette.ColorRole.Button: "#2a2c30",
        QPalette.ColorRole.ButtonText: "#e8e8ea",
        QPalette.ColorRole.Highlight: "#4f7cff",
        QPalette.ColorRole.HighlightedText: "#ffffff",
        QPalette.ColorRole.Link: "#8fb0ff",
        QPalette.ColorRole.PlaceholderText: "#8e9096",
        QPalette.ColorRole.ToolTipBase: "#2a2c30",
        QPalette.ColorRole.ToolTipText: "#e8e8ea",
        QPalette.ColorRole.Mid: "#45474c",
        QPalette.ColorRole.Midlight: "#34363a",
        QPalette.ColorRole.Dark: "#111214",
        QPalette.ColorRole.Light: "#4a4c52",
        QPalette.ColorRole.BrightText: "#ffffff",
    }
    for role, color in c.items():
        p.setColor(role, QColor(color))
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText, QPalette.ColorRole.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor("#6c6e74"))
    return p


def light_palette() -> QPalette:
    p = QStyleFactory.create("Fusion").standardPalette()
    p.setColor(QPalette.ColorRole.Highlight, QColor("#3d6bf0"))
    p.setColor(QPalette.ColorRole.Link, QColor("#2f5bd8"))
    return p


def is_dark(palette: QPalette) -> bool:
    return palette.color(QPalette.ColorRole.Window).lightness() < 128


def apply_theme(app: QApplication, mode: str = "system") -> None:
    hints = QGuiApplication.styleHints()
    want_dark = (mode == "dark") or (mode == "system" and hints.colorScheme() == Qt.ColorScheme.Dark)
    if mode in ("light", "dark") and hasattr(hints, "setColorScheme"):
        hints.setColorScheme(Qt.ColorScheme.Dark if want_dark else Qt.ColorScheme.Light)
    elif mode == "system" and hasattr(hints, "unsetColorScheme"):
        hints.unsetColorScheme()
    # Platforms without a dark palette of their own (or a forced mode) get ours, on Fusion.
    platform = app.style().standardPalette()
    if want_dark != is_dark(platform) or mode != "system":
        app.setStyle("Fusion")
        app.setPalette(dark_palette() if want_dark else light_palette())
    else:
        app.setPalette(platform)
    qss = resources_dir() / "theme.qss"
    app.setStyleSheet(qss.read_text(encoding="utf-8") if qss.is_file() else "")
    clear_icon_cache()
