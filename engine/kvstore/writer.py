"""The writer thread and its bounded buffer pool.

Memory bound: the owner thread fills a host buffer from the device, hands it to the writer and
takes the other one; with two buffers in the pool at most two units of spill data exist in host
memory at any time, whatever the session length.

Durability: a blob is written through AtomicFile (temp file next to its final name,
synced, published) and its directory synced before the manifest transaction that references it
commits; what "synced" means on each OS lives in engine/platform/files.py.
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)


class BufferPool:
    """`count` reusable host buffers of `nbytes` (pinned when copying from CUDA: faster DMA)."""

    def __init__(self, nbytes: int, count: int = 2, pin: bool = False):
        self.nbytes = nbytes
        self.count = count
        self.pin = pin
        self._free: queue.Queue = queue.Queue()
        self._made = 0
        self._lock = threading.Lock()

    def acquire(self, block: bool = True) -> torch.Tensor | None:
        with self._lock:
            if self._free.empty() and self._made < self.count:
                self._made += 1  # allocate lazily: a store that never spills holds no buffers
                return torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=self.pin)
        try:
            return self._free.get(block=block)
        except queue.Empty:
            return None

    def available(self) -> bool:
        return not self._free.empty() or self._made < self.count

    def release(self, buf: torch.Tensor) -> None:
        self._free.put(buf)

    @property
    def allocated_bytes(self) -> int:
        return self._made * self.nbytes


class WriterThread:
    """Runs submitted callables in order on one daemon thread (file writes, manifest commits)."""

    def __init__(self, name: str = "kvstore-writer"):
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        self._q.put((fn, args))

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            fn, args = item
            try:
                fn(*args)
            except BaseException:  # a task must never kill the writer; tasks report their own errors
                log.exception("kvstore writer task failed")

    def flush(self, timeout: float | None = None) -> bool:
        done = threading.Event()
        self.submit(done.set)
        return done.wait(timeout)

    def stop(self, timeout: float | None = None) -> None:
        self._q.put(None)
        self._thread.join(timeout)


def unlink_quiet(path: str) -> bool:
    """Remove a file; False if it was not there (or could not be removed, which is logged)."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
    except OSError as e:
        if e.errno not in (errno.ENOENT, errno.ENOTDIR):
            log.warning("kvstore: cannot remove %s: %s", path, e)
        return False
