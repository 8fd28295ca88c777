"""Every file-system call that differs by OS, in one place; the rest of the code calls these.

What each OS gets (chosen once, at import, from sys.platform and what `os` offers):

- a file's bytes durable: Linux `fdatasync`; macOS `fcntl(F_FULLFSYNC)` (plain fsync leaves
  the data in the drive's cache), plain fsync where a filesystem refuses F_FULLFSYNC; Windows
  `os.fsync` (FlushFileBuffers).
- a rename durable: fsync of the directory on Linux and macOS (F_FULLFSYNC there); Windows
  cannot open a directory, so a file is published with MoveFileExW(MOVEFILE_WRITE_THROUGH),
  which returns once the rename is on disk.
- positional I/O: os.pread / pwrite / preadv where they exist; elsewhere (Windows; preadv on
  some macOS builds) a seek and plain reads/writes on the descriptor. That is safe because
  every descriptor opened here is used by one thread only.
- O_BINARY on Windows (no newline translation), O_CLOEXEC where it exists.
- the lock that keeps a second process out of a folder: `filelock` (flock on POSIX, LockFileEx
  on Windows); the OS drops it when the process dies, so a crash never leaves a stale lock.
"""

from __future__ import annotations

import errno
import io
import os
import secrets
import sys
from collections.abc import Iterable
from types import ModuleType
from typing import BinaryIO

import filelock

SYSTEM = sys.platform  # "linux", "darwin", "win32", ...: read once, so a test can simulate another OS
TMP_SUFFIX = ".tmp"
_CHUNK = 1 << 20

_pread = getattr(os, "pread", None)
_pwrite = getattr(os, "pwrite", None)
_preadv = getattr(os, "preadv", None)
_fdatasync = getattr(os, "fdatasync", None)
_O_BINARY = getattr(os, "O_BINARY", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0) or getattr(os, "O_NOINHERIT", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_fcntl: ModuleType | None
try:
    import fcntl as _fcntl
except ImportError:  # Windows
    _fcntl = None
# 51 is <sys/fcntl.h>'s value, for a Python whose fcntl module does not name it
_F_FULLFSYNC = getattr(_fcntl, "F_FULLFSYNC", 51) if SYSTEM == "darwin" and _fcntl is not None else None


def _load_move_file_ex():
    """Windows MoveFileExW, or None (elsewhere, or a Python without ctypes.WinDLL)."""
    if SYSTEM != "win32":
        return None
    try:
        import ctypes

        fn = ctypes.WinDLL("kernel32", use_last_error=True).MoveFileExW
        fn.argtypes = (ctypes.c_wchar_p, ctypes.c_wchar_p, ctypes.c_uint32)
        fn.restype = ctypes.c_int
        return fn
    except (ImportError, AttributeError, OSError):
        return None


def _load_sync_file_range():
    """Linux sync_file_range(2): starts writeback without waiting, so the final fdatasync finds
    little left to do. Other systems have no equivalent; there it is simply not used."""
    if SYSTEM != "linux":
        return None
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


_move_file_ex = _load_move_file_ex()
_sync_file_range = _load_sync_file_range()
_MOVEFILE_REPLACE_EXISTING = 0x1
_MOVEFILE_WRITE_THROUGH = 0x8
_SYNC_FILE_RANGE_WRITE = 2


def capabilities() -> dict[str, bool | str]:
    """What this process's platform layer uses (diagnostics and tests)."""
    return {
        "system": SYSTEM,
        "pread": _pread is not None,
        "pwrite": _pwrite is not None,
        "preadv": _preadv is not None,
        "fdatasync": _fdatasync is not None,
        "full_fsync": _F_FULLFSYNC is not None,
        "dir_fsync": SYSTEM != "win32",
        "write_through_rename": _move_file_ex is not None,
        "fcntl": _fcntl is not None,
    }


def sqlite_durable(db) -> None:
    """Make a SQLite connection's commits reach the disk, not the drive's cache: on macOS SQLite's
    own fsync is a plain fsync unless told to use F_FULLFSYNC (for the WAL checkpoint too)."""
    if _F_FULLFSYNC is not None and _fcntl is not None:  # set only where fcntl is
        db.execute("PRAGMA fullfsync=ON")
        db.execute("PRAGMA checkpoint_fullfsync=ON")


# ---------------------------------------------------------------- opening and positional I/O


def open_read(path: str | os.PathLike) -> int:
    return os.open(path, os.O_RDONLY | _O_BINARY | _O_CLOEXEC)


def _create_new(path: str | os.PathLike) -> int:
    # 0600: everything Parley writes (history, pictures, KV blocks) is the user's private data
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_BINARY | _O_CLOEXEC, 0o600)


def pread(fd: int, nbytes: int, offset: int) -> bytes:
    """Up to `nbytes` from `offset` (fewer only at end of file)."""
    if _pread is not None:
        return _pread(fd, nbytes, offset)
    os.lseek(fd, offset, os.SEEK_SET)
    out = bytearray()
    while len(out) < nbytes:
        chunk = os.read(fd, nbytes - len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def pwrite_all(fd: int, data, offset: int) -> None:
    """Write all of `data` at `offset`; the descriptor's position is left where it was."""
    mv = memoryview(data).cast("B")
    if _pwrite is not None:
        while len(mv):
            n = _pwrite(fd, mv, offset)
            if n <= 0:
                raise OSError(errno.EIO, "short write")
            mv, offset = mv[n:], offset + n
        return
    here = os.lseek(fd, 0, os.SEEK_CUR)
    os.lseek(fd, offset, os.SEEK_SET)
    try:
        write_all(fd, mv)
    finally:
        os.lseek(fd, here, os.SEEK_SET)


def write_all(fd: int, data) -> int:
    mv = memoryview(data).cast("B")
    total = len(mv)
    while len(mv):
        n = os.write(fd, mv)
        if n <= 0:
            raise OSError(errno.EIO, "short write")
        mv = mv[n:]
    return total


def read_into(fd: int, views: list[memoryview], offset: int = 0) -> int:
    """Fill `views` in order from `offset`, straight into their memory (one preadv where the OS
    has it), resuming after short reads. Returns bytes read; less than asked only at end of file."""
    pending = [v for v in views if len(v)]
    if _preadv is None:
        os.lseek(fd, offset, os.SEEK_SET)
        f = io.FileIO(fd, "rb", closefd=False)
        total = 0
        for v in pending:
            while len(v):
                got = f.readinto(v)
                if not got:
                    return total
                total += got
                v = v[got:]
        return total
    iov_max = 1024
    total = 0
    while pending:
        got = _preadv(fd, pending[:iov_max], offset + total)
        if got <= 0:
            return total
        total += got
        while got and pending:  # drop fully read views, trim a partly read one
            if got >= len(pending[0]):
                got -= len(pending[0])
                pending.pop(0)
            else:
                pending[0] = pending[0][got:]
                got = 0
    return total


# ---------------------------------------------------------------- durability


def sync_file(fd: int) -> None:
    """The file's bytes (and the size needed to read them back) reach stable storage."""
    if _F_FULLFSYNC is not None and _fcntl is not None:  # set only where fcntl is
        try:
            _fcntl.fcntl(fd, _F_FULLFSYNC)
            return
        except OSError:  # some filesystems (network, FAT drives) refuse it: fsync is the best left
            pass
        os.fsync(fd)
    elif _fdatasync is not None:
        _fdatasync(fd)
    else:
        os.fsync(fd)


def sync_dir(path: str | os.PathLike) -> bool:
    """Make the renames in a directory durable. False where the OS has no directory fsync
    (Windows: `publish` writes its renames through instead) or the filesystem refuses one."""
    if SYSTEM == "win32":
        return False
    fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    try:
        if _F_FULLFSYNC is not None:
            sync_file(fd)
        else:
            os.fsync(fd)
        return True
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF):
            return False
        raise
    finally:
        os.close(fd)


def _last_windows_error() -> OSError:
    """This thread's last Windows error (after a failed MoveFileExW) as an OSError."""
    import ctypes

    if sys.platform != "win32":  # _move_file_ex is only ever loaded there (ctypes.WinDLL)
        raise RuntimeError("a Windows error asked for off Windows")
    return ctypes.WinError(ctypes.get_last_error())


def publish(tmp: str | os.PathLike, final: str | os.PathLike, durable: bool = True) -> None:
    """Atomically put `tmp` in `final`'s place (replacing it). Windows: written through to disk
    when `durable`; elsewhere the caller syncs the directory (`sync_dir`)."""
    if durable and _move_file_ex is not None:
        if not _move_file_ex(os.fspath(tmp), os.fspath(final), _MOVEFILE_REPLACE_EXISTING | _MOVEFILE_WRITE_THROUGH):
            raise _last_windows_error()
        return
    os.replace(tmp, final)


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    if _sync_file_range is not None and nbytes > 0:
        _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)  # advisory: errors ignored


# ---------------------------------------------------------------- the atomic write


def is_temp_name(name: str) -> bool:
    """A file AtomicFile left behind (a crash between create and publish)."""
    return name.endswith(TMP_SUFFIX)


class AtomicFile:
    """temp file next to the final name -> write -> sync -> publish. Readers see the old file or
    the whole new one, never a part. The caller syncs the directory (sync_dir) before anything
    that names the file is committed; `atomic_write` does both."""

    def __init__(self, final_path: str | os.PathLike, durable: bool = True):
        self.final = os.fspath(final_path)
        self.durable = durable
        folder, name = os.path.split(self.final)
        # hidden (listings of pictures skip dot files) and lowercase like every name we make
        self.tmp = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}")
        self.fd: int | None = _create_new(self.tmp)
        self.size = 0
        self._kicked = 0  # bytes already handed to writeback

    def _open_fd(self) -> int:
        if self.fd is None:
            raise ValueError(f"{self.final}: the temp file was already committed or discarded")
        return self.fd

    def write(self, data) -> None:
        fd = self._open_fd()
        self.size += write_all(fd, data)
        if self.durable and self.size - self._kicked >= 1 << 20:
            start_writeback(fd, self._kicked, self.size - self._kicked)
            self._kicked = self.size

    def pwrite(self, data, offset: int) -> None:
        pwrite_all(self._open_fd(), data, offset)

    def commit(self) -> None:
        fd = self._open_fd()
        if self.durable:
            sync_file(fd)  # before the rename: a published name never shows missing bytes
        os.close(fd)
        self.fd = None
        publish(self.tmp, self.final, self.durable)

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

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, exc_type, *_exc) -> None:
        if exc_type is None and self.fd is not None:
            try:
                self.commit()
            except BaseException:
                self.discard()
                raise
        elif self.fd is not None or exc_type is not None:
            self.discard()


def atomic_write(
    dest: str | os.PathLike, data: bytes | bytearray | memoryview | BinaryIO | Iterable[bytes], durable: bool = True
) -> None:
    """Write `data` (bytes, a binary file object, or an iterable of chunks) to `dest` atomically
    and, when `durable`, so that both the bytes and the name survive a power cut."""
    folder = os.path.dirname(os.path.abspath(dest))
    os.makedirs(folder, exist_ok=True)
    with AtomicFile(dest, durable) as f:
        if isinstance(data, (bytes, bytearray, memoryview)):
            f.write(data)
        elif hasattr(data, "read"):
            while chunk := data.read(_CHUNK):
                f.write(chunk)
        else:
            for chunk in data:
                f.write(chunk)
    if durable:
        sync_dir(folder)


# ---------------------------------------------------------------- the folder lock


class FolderBusy(OSError):
    """Another process holds the folder's lock."""


class FolderLock:
    """An exclusive, non-waiting lock on a lock file; `close()` releases it, and so does the OS
    when the process dies. Not re-entrant across processes or objects: a second FolderLock on the
    same file, even in this process, is refused."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self._lock = filelock.FileLock(self.path, timeout=0, mode=0o600, thread_local=False)
        try:
            self._lock.acquire()
        except filelock.Timeout as e:
            raise FolderBusy(errno.EAGAIN, "locked by another process", self.path) from e

    def close(self) -> None:
        if self._lock.is_locked:
            self._lock.release(force=True)


# ---------------------------------------------------------------- process limits


def raise_open_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit (a server holds one per
    connection; many systems start processes at 1024) and return the limit now in force."""
    try:
        import resource
    except ImportError:  # Windows: no such per-process limit to raise
        return 1 << 16
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if sys.platform == "darwin":  # macOS refuses more than OPEN_MAX (10240) here, whatever the hard limit
        want = min(want, 10240)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 1 << 16
