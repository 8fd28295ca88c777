"""Where Parley keeps its state when no --data-dir is given."""
from __future__ import annotations

from pathlib import Path

import platformdirs


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("Parley", appauthor=False))
