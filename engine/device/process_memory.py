"""This process's private memory, to measure what a step allocates that no tensor accounts for.

The memory dock counts tensors exactly, but a model's tokenizer (Rust tables) and processor hold
memory no tensor shows; the loader measures them as the growth of private memory around their
load. Private means anonymous (heap, not file-backed code or a mapped safetensors file): RSS minus
shared pages on Linux, the private bytes on Windows, RSS on macOS (psutil has no split there).
"""

from __future__ import annotations

import sys

import psutil

from .heap_trim import return_freed_heap


def private_bytes() -> int:
    return_freed_heap()  # freed-but-kept heap is not held data
    info = psutil.Process().memory_info()
    if sys.platform.startswith("linux"):
        return max(0, info.rss - info.shared)
    if sys.platform == "win32":
        return int(getattr(info, "private", info.rss))
    return info.rss


def growth_during(step):
    """(step's result, bytes of private memory it added; 0 if it shrank). Other threads' allocations
    in the meantime count too: the figure is close, not exact, which the dock says."""
    before = private_bytes()
    result = step()
    return result, max(0, private_bytes() - before)
