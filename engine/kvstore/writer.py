"""The writer thread, its bounded buffer pool, and crash-safe file creation.

Memory bound: the owner thread fills a host buffer from the device, hands it to the writer and
takes the other one; with two buffers in the pool at most two units of spill data exist in host
memory at any time, whatever the session length.

Durability: a blob is written to a temp file next to its final name, fsynced, renamed, and its
directory fsynced before the manifest transaction that references it commits.
"""
from __future__ import annotations

import errno
import logging
import os
import queue
import secrets
import threading
from typing import Any, Callable

import torch

from .blob import TMP_SUFFIX

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


def _load_sync_file_range():
    """Linux sync_file_range(2): start writeback of what was just written without waiting, so
    the fdatasync before the rename finds little left to do. Absent elsewhere: a no-op."""
    try:
        import ctypes
        import ctypes.util
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.sync_file_range
        fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        fn.restype = ctypes.c_int
        return fn
    except (OSError, AttributeError):
        return None


_sync_file_range = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    if _sync_file_range is not None and nbytes > 0:
        _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)  # advisory: errors ignored


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DurableFile:
    """temp file -> write -> fsync -> rename. The caller fsyncs the directory afterwards."""

    def __init__(self, final_path: str, sync: bool = True):
        self.final = final_path
        self.sync = sync
        self.tmp = f"{final_path}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}"
        self.fd: int | None = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        self.size = 0
        self._kicked = 0  # bytes already handed to writeback

    def write(self, data) -> None:
        mv = memoryview(data).cast("B")
        while len(mv):
            n = os.write(self.fd, mv)
            if n <= 0:
                raise OSError(errno.EIO, "short write")
            mv = mv[n:]
            self.size += n
        if self.sync and self.size - self._kicked >= 1 << 20:
            start_writeback(self.fd, self._kicked, self.size - self._kicked)
            self._kicked = self.size

    def pwrite(self, data: bytes, offset: int) -> None:
        mv = memoryview(data)
        while len(mv):
            n = os.pwrite(self.fd, mv, offset)
            if n <= 0:
                raise OSError(errno.EIO, "short write")
            mv, offset = mv[n:], offset + n

    def commit(self) -> None:
        if self.sync:
            os.fdatasync(self.fd)  # data + the size needed to read it back; before the rename
        os.close(self.fd)
        self.fd = None
        os.rename(self.tmp, self.final)

    def discard(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None
        try:
            os.unlink(self.tmp)
        except OSError:
            pass


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

    @property
    def is_writer(self) -> bool:
        return threading.current_thread() is self._thread


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
