"""Shared bits for the benchmarks (run as scripts: `python tests/bench/NAME.py`)."""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def workdir(name: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"parley-bench-{name}-"))


def ratio_line(label: str, value: float, goal: str) -> str:
    return f"{label}: {value:.3f}  (goal {goal})"
