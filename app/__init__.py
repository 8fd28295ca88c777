"""Parley's window (PySide6). Talks to the engine only through app.connection.bridge."""

from __future__ import annotations

from pathlib import Path

from . import pyside_refcount_fix
from .version import VERSION as __version__

pyside_refcount_fix.apply()  # before any signal is emitted: see the module


def run_app(model_path: str | None, data_dir: Path, settings: dict | None = None) -> int:
    from .shell.main import run_app as _run_app

    return _run_app(model_path, data_dir, settings)


__all__ = ["__version__", "run_app"]
