"""Where Parley keeps its state when no --data-dir is given, and how its folders and files are
made private: conversations and pictures are the user's alone (folders 0700, files 0600)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

# The shipped demo model (trained by packaging/demo_model/train_shapes.py); the default when no model is given.
DEMO_MODEL = Path(__file__).resolve().parents[2] / "resources" / "models" / "parley-shapes"


def is_demo_model(path: str | None) -> bool:
    """Whether a model folder is the built-in demo: this install's, or another Parley install's (an
    older version's, or one moved since, remembered in its settings), by the same
    resources/models/<name> ending. A server's address never is."""
    if not path or "://" in path:
        return False
    return Path(path).parts[-3:] == DEMO_MODEL.parts[-3:]


PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("Parley", appauthor=False))


def create_data_dir(path: Path | str) -> Path:
    """The data folder: created private; an existing folder the user chose is left as it is
    (Parley's own folders and files inside it are private either way)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
    return path


def private_dir(path: Path | str) -> Path:
    """One of Parley's own folders: created 0700, and tightened to 0700 if an older version
    left it readable by others."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
    _tighten(path, PRIVATE_DIR_MODE)
    return path


def private_file(path: Path | str) -> Path:
    """Make sure a file of Parley's exists with mode 0600 (SQLite gives its -wal and -shm
    files the database file's mode, so creating the database this way covers them)."""
    path = Path(path)
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, PRIVATE_FILE_MODE))
    _tighten(path, PRIVATE_FILE_MODE)
    return path


def private_opener(path: str, flags: int) -> int:
    """`open(..., opener=private_opener)`: a new file is created 0600 from its first byte."""
    return os.open(path, flags, PRIVATE_FILE_MODE)


def _tighten(path: Path, mode: int) -> None:
    if os.name != "posix":  # Windows folders in the user profile are private already
        return
    if path.stat().st_mode & 0o777 != mode:
        os.chmod(path, mode)
