"""torch and transformers are imported under one lock, by whichever thread gets there first.

Two threads importing those packages at once can deadlock on Python's per-module import locks;
Python breaks such a deadlock by handing one thread a half-initialised module, which shows up as
"cannot import name 'AutoModelForImageTextToText' from 'transformers'" and kills that thread. The
engine's owner thread imports them as it starts (so the window is shown before, see local/engine.py);
any other thread that needs them (the window checking a model folder, the Models page's fit
estimate, tests building models) goes through `heavy()` and waits for that import instead.
"""
from __future__ import annotations

import importlib
import threading

_LOCK = threading.RLock()
_done = False

# the engine's torch-backed modules: importing them imports torch and transformers
ENGINE_MODULES = ("engine.model.load", "engine.local.memory_manager", "engine.local.spill_scheduler",
                  "engine.local.pipeline", "engine.vision.gate")


def heavy() -> None:
    """Import torch, transformers and the engine's modules built on them, once per process."""
    global _done
    if _done:
        return
    with _LOCK:
        if _done:
            return
        import torch  # noqa: F401
        import transformers

        # the names the engine reads resolve transformers' lazy submodules: do it here, locked
        transformers.AutoModelForImageTextToText, transformers.AutoProcessor, transformers.AutoConfig
        for name in ENGINE_MODULES:
            importlib.import_module(name)
        _done = True
