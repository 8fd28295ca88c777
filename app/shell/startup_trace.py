"""$PARLEY_STARTUP_TRACE names a file the app appends a line to at each startup milestone
(`shown`: the window is up and the event loop runs; `ready` / `failed`: the first model load
ended), with the wall-clock time and which heavy modules were imported by then. A benchmark or
test that launched the app times its start from it, and checks the window came before torch.
No Qt here: the launcher reads the file with `read_trace`."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

TRACE_ENV = "PARLEY_STARTUP_TRACE"
HEAVY_MODULES = ("torch", "transformers")

log = logging.getLogger(__name__)


def mark(event: str) -> None:
    path = os.environ.get(TRACE_ENV)
    if not path:
        return
    heavy = ",".join(m for m in HEAVY_MODULES if m in sys.modules) or "none"
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{event} {time.time():.6f} heavy={heavy}\n")
    except OSError as exc:
        log.warning("cannot write %s: %s", path, exc)


def read_trace(path: str | Path) -> dict[str, tuple[float, str]]:
    """event -> (wall-clock time, heavy modules then, comma-separated or "none"); the first
    line of each event wins (a later model switch adds more `ready` lines)."""
    marks: dict[str, tuple[float, str]] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return marks
    for line in text.split("\n")[:-1]:  # the part after the last newline may be half written
        parts = line.split()
        if len(parts) == 3 and parts[2].startswith("heavy="):
            try:
                marks.setdefault(parts[0], (float(parts[1]), parts[2][len("heavy=") :]))
            except ValueError:
                continue
    return marks
