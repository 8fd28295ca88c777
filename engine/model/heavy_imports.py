"""torch and transformers are imported under one lock, by whichever thread gets there first.

Two threads importing those packages at once can deadlock on Python's per-module import locks;
Python breaks such a deadlock by handing one thread a half-initialised module, which shows up as
"cannot import name 'AutoModelForImageTextToText' from 'transformers'" and kills that thread. The
engine's owner thread imports them as it starts (so the window is shown before, see local/engine.py);
any other thread that needs them (the Models page's fit estimate, tests building models) goes
through `heavy()` and waits for that import instead. The engine registers the imports of its
own torch-backed modules here (`import_with_torch`), so they happen under the same lock, and
this module names nothing above it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

_LOCK = threading.RLock()
_done = False
_importers: list[Callable[[], None]] = []


def import_with_torch(importer: Callable[[], None]) -> Callable[[], None]:
    """Register `importer` (import statements of torch-backed modules) to run under the lock,
    with torch, by the next `heavy()`; returns it, so it serves as a decorator."""
    global _done
    with _LOCK:
        _importers.append(importer)
        _done = False  # if torch is in already, the next heavy() runs it (imports done are cheap)
    return importer


def heavy() -> None:
    """Import torch, transformers and the modules registered with them, once per process."""
    global _done
    if _done:
        return
    with _LOCK:
        if _done:
            return
        import torch  # noqa: F401
        import transformers

        # the names the engine reads resolve transformers' lazy submodules: do it here, locked
        transformers.AutoModelForImageTextToText, transformers.AutoProcessor, transformers.AutoConfig  # noqa: B018
        for importer in list(_importers):
            importer()
        _done = True
