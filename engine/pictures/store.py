"""The one content-addressed picture folder, shared by the chat history and the API.

A picture is kept as `<folder>/<ab>/<blake3 hex>.<ext>` holding its original bytes unchanged, so
the same bytes always name the same file (whichever way they came in) and the file name carries
the digest the engine's image cache is keyed by: a PictureRef costs no read.

Two kinds of picture share the folder. Kept ones (the window's) live until their owner deletes
them. Transient ones (pictures an API client sent inline) are marked by an empty file in
`<folder>/.transient/` and are size-capped and aged out here; only marked files are ever pruned,
so a picture a conversation references is never lost to the cap, and a kept put of the same bytes
clears the mark.
"""
from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import Iterator

from ..platform.paths import private_dir
from .ref import PictureRef, digest_of
from ..platform.files import atomic_write, is_temp_name

NAME_RE = re.compile(r"^[0-9a-f]{64}(\.[a-z0-9]{1,8})?$")
_SHARD_RE = re.compile(r"^[0-9a-f]{2}$")
# one lock for every store in the process: the window's and the API's share a folder
_LOCK = threading.RLock()


def extension(suffix: str) -> str:
    """'.PNG' -> '.png'; anything that is not a short alphanumeric suffix -> ''."""
    s = suffix.lower().lstrip(".")
    return "." + s if s and re.fullmatch(r"[a-z0-9]{1,8}", s) else ""


class PictureStore:
    def __init__(self, folder: Path | str, max_transient_bytes: int = 2 << 30, keep_s: float = 3600.0,
                 max_age_s: float = 7 * 86400.0):
        self.folder = Path(folder)
        self.marks = self.folder / ".transient"
        self.max_transient_bytes = max_transient_bytes
        self.keep_s = keep_s  # a transient picture used this recently is never removed (a queued turn may read it)
        self.max_age_s = max(max_age_s, keep_s)
        self._known: dict[str, str] = {}  # digest -> file name, for pictures seen by this process
        self._sizes: dict[str, int] | None = None  # transient pictures, scanned on first use
        self.pruned = 0  # transient pictures deleted to stay under the cap
        self.expired = 0  # transient pictures deleted by sweep() for age

    # ------------------------------------------------------------ names and files

    def path(self, name: str) -> Path:
        check_name(name)
        return self.folder / name[:2] / name

    def ref(self, name: str) -> PictureRef:
        """The engine's view of a stored picture, from its name alone (no read)."""
        return PictureRef(str(self.path(name)), name[:64])

    def find(self, digest: str) -> str | None:
        """The stored file of this content, whatever its extension (None when there is none)."""
        with _LOCK:
            name = self._known.get(digest)
        if name is not None and self.path(name).is_file():
            return name
        try:
            for entry in os.scandir(self.folder / digest[:2]):
                if entry.name.startswith(digest) and NAME_RE.match(entry.name) and entry.is_file():
                    with _LOCK:
                        self._known[digest] = entry.name
                    return entry.name
        except (FileNotFoundError, NotADirectoryError):
            pass
        return None

    def put(self, data: bytes, ext: str, transient: bool = False, digest: str | None = None) -> str:
        """Store `data` (once per content) and return its file name. A kept put also keeps a
        picture that was transient; a transient put never demotes a kept one. `digest`: the
        caller's own BLAKE3 hex of `data`, when it already has one."""
        digest = digest or digest_of(data)
        with _LOCK:
            name = self.find(digest)
            if name is None:
                name = digest + extension(ext)
                if transient:
                    self._mark(name)  # the mark first: an unmarked file is never pruned by the cap
                private_dir(self.folder)
                private_dir(self.folder / name[:2])
                atomic_write(self.path(name), data)  # bytes and name durable before anyone names the picture
                self._known[digest] = name
                if transient:
                    self._scan()
                    self._sizes[name] = len(data)
                    if sum(self._sizes.values()) > self.max_transient_bytes:
                        self._prune(keep=name)
                return name
            path = self.path(name)
            if _size(path) != len(data):  # a copy damaged outside Parley: this put heals it
                atomic_write(path, data)
            _touch(path)  # a use: LRU and age count from now
            if not transient and self._is_transient(name):
                self._unmark(name)
            return name

    def names(self) -> Iterator[tuple[str, Path]]:
        """Every file in the picture folders (stored pictures and temp files a crash left)."""
        try:
            shards = [e for e in os.scandir(self.folder) if _SHARD_RE.match(e.name) and e.is_dir()]
        except FileNotFoundError:
            return
        for shard in shards:
            for entry in os.scandir(shard.path):
                if entry.is_file(follow_symlinks=False):
                    yield entry.name, Path(entry.path)

    def is_transient(self, name: str) -> bool:
        return self._is_transient(name)

    def remove(self, name: str) -> None:
        with _LOCK:
            self.path(name).unlink(missing_ok=True)
            self._unmark(name)
            self._known.pop(name[:64], None)

    # ------------------------------------------------------------ transient pictures

    def _is_transient(self, name: str) -> bool:
        return (self.marks / name).exists()

    def _mark(self, name: str) -> None:
        private_dir(self.marks)
        (self.marks / name).touch()

    def _unmark(self, name: str) -> None:
        (self.marks / name).unlink(missing_ok=True)
        if self._sizes is not None:
            self._sizes.pop(name, None)

    def _scan(self) -> None:
        if self._sizes is not None:
            return
        self._sizes = {}
        try:
            marked = [e.name for e in os.scandir(self.marks) if NAME_RE.match(e.name)]
        except FileNotFoundError:
            marked = []
        for name in marked:
            try:
                self._sizes[name] = self.path(name).stat().st_size
            except OSError:
                (self.marks / name).unlink(missing_ok=True)  # the file went; so does its mark

    def _prune(self, keep: str) -> None:
        total, now = sum(self._sizes.values()), time.time()
        for mtime, name in sorted((_mtime(self.path(n)), n) for n in self._sizes):
            if total <= self.max_transient_bytes * 0.9:
                break
            if not self._is_transient(name):  # kept since (the window imported it): not ours to count
                total -= self._sizes.pop(name, 0)
                continue
            if name == keep or now - mtime < self.keep_s:
                continue
            try:
                self.path(name).unlink(missing_ok=True)
            except OSError:
                continue
            total -= self._sizes.get(name, 0)
            self._unmark(name)
            self._known.pop(name[:64], None)
            self.pruned += 1

    def sweep(self) -> int:
        """Delete transient pictures unused for `max_age_s`, and temp files a crash left; make
        what stays private (0600 in 0700 folders, whatever an older version left). -> files deleted."""
        now, gone = time.time(), 0
        if not self.folder.is_dir():
            return 0
        for folder in [self.folder, *{p.parent for _, p in self.names()}]:
            private_dir(folder)
        for name, path in list(self.names()):
            try:
                st = path.stat()
                if is_temp_name(name) or name.startswith("."):
                    if now - st.st_mtime > self.keep_s:
                        path.unlink()
                        gone += 1
                    continue
                if NAME_RE.match(name) and self._is_transient(name) and now - st.st_mtime > self.max_age_s:
                    self.remove(name)
                    with _LOCK:
                        self.expired += 1
                    gone += 1
                elif st.st_mode & 0o077:
                    os.chmod(path, 0o600)
            except FileNotFoundError:
                continue
        return gone


def check_name(name: str) -> None:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ValueError(f"not a picture name: {name!r}")


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
