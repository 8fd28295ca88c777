"""The one content-addressed picture folder, shared by the chat history and the API.

A picture is kept as `<folder>/<ab>/<blake3 hex>.<ext>` holding its original bytes unchanged, so
the same bytes always name the same file (whichever way they came in) and the file name carries
the digest the engine's image cache is keyed by: a PictureRef costs no read.

Two kinds of picture share the folder. Kept ones (the window's) live until their owner deletes
them. Transient ones (pictures an API client sent inline) are marked by an empty file in
`<folder>/.transient/` and are size-capped and aged out here; only marked files are ever pruned,
so a picture a conversation references is never lost to the cap, and a kept put of the same bytes
clears the mark.

The cap holds at every moment: room is made (oldest transient first) before a transient picture
is written, and a transient write never takes the disk below `min_free_bytes`. Pictures a turn
in progress will read are held (`hold()`) and never pruned; when only held ones remain, or one
picture alone exceeds the cap, the put is refused with PictureSpaceError.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ..platform.files import atomic_write, is_temp_name
from ..platform.paths import private_dir
from .ref import PictureRef, digest_of

NAME_RE = re.compile(r"^[0-9a-f]{64}(\.[a-z0-9]{1,8})?$")
_SHARD_RE = re.compile(r"^[0-9a-f]{2}$")
# one lock for every store in the process: the window's and the API's share a folder
_LOCK = threading.RLock()


class PictureSpaceError(Exception):
    """A transient picture that cannot be stored; the message says why in one sentence.
    `too_big`: it alone exceeds the cap (it never fits); else there is no room now."""

    def __init__(self, message: str, too_big: bool = False):
        super().__init__(message)
        self.too_big = too_big


class Hold:
    """Pictures a turn in progress will read (`PictureStore.hold()`): never pruned until
    `release()` (safe to call more than once)."""

    def __init__(self, store: PictureStore):
        self._store = store
        self.names: list[str] = []
        self._released = False

    def release(self) -> None:
        with _LOCK:
            if self._released:
                return
            self._released = True
            for name in self.names:
                left = self._store._held.get(name, 0) - 1
                if left > 0:
                    self._store._held[name] = left
                else:
                    self._store._held.pop(name, None)


def extension(suffix: str) -> str:
    """'.PNG' -> '.png'; anything that is not a short alphanumeric suffix -> ''."""
    s = suffix.lower().lstrip(".")
    return "." + s if s and re.fullmatch(r"[a-z0-9]{1,8}", s) else ""


class PictureStore:
    def __init__(
        self,
        folder: Path | str,
        max_transient_bytes: int = 2 << 30,
        keep_s: float = 3600.0,
        max_age_s: float = 7 * 86400.0,
        min_free_bytes: int | None = None,
    ):
        self.folder = Path(folder)
        self.marks = self.folder / ".transient"
        self.max_transient_bytes = max_transient_bytes
        self.keep_s = keep_s  # a temp file older than this is a crash's leftover (sweep)
        self.max_age_s = max(max_age_s, keep_s)
        # free space a transient write leaves on the disk: as the KV store's floor, a quarter of the cap, at most 1 GiB
        self.min_free_bytes = min(1 << 30, max_transient_bytes // 4) if min_free_bytes is None else min_free_bytes
        self._known: dict[str, str] = {}  # digest -> file name, for pictures seen by this process
        self._sizes: dict[str, int] | None = None  # transient pictures, scanned on first use
        self._held: dict[str, int] = {}  # name -> holds on it (turns in progress that will read it)
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

    def hold(self) -> Hold:
        """A hold for the pictures one turn will read (pass it to `put`, release it when the turn ends)."""
        return Hold(self)

    def put_file(self, src: str | Path, ext: str, digest: str) -> str:
        """Keep a large file (a document, a video) once per content, streamed (never whole in
        memory). `digest`: BLAKE3 hex of its bytes, from the caller's check; a file that changes
        meanwhile is refused when its pages or frames are read (engine/pictures/ref.py)."""
        with _LOCK:
            name = self.find(digest)
        if name is None:
            name = digest + extension(ext)
            private_dir(self.folder)
            private_dir(self.folder / name[:2])
            with open(src, "rb") as f:  # outside the lock: a copy of a gigabyte must not stall the API
                atomic_write(self.path(name), f)
            with _LOCK:
                self._known[digest] = name
        else:
            _touch(self.path(name))
            with _LOCK:
                if self._is_transient(name):
                    self._unmark(name)
        return name

    def put(
        self, data: bytes, ext: str, transient: bool = False, digest: str | None = None, hold: Hold | None = None
    ) -> str:
        """Store `data` (once per content) and return its file name. A kept put also keeps a
        picture that was transient; a transient put never demotes a kept one. `digest`: the
        caller's own BLAKE3 hex of `data`, when it already has one. `hold`: the picture is not
        pruned until that hold is released. A transient put with no room raises PictureSpaceError."""
        digest = digest or digest_of(data)
        with _LOCK:
            name = self.find(digest)
            if name is None:
                name = digest + extension(ext)
                if transient:
                    self._make_room(len(data))
                    self._mark(name)  # the mark first: an unmarked file is never pruned by the cap
                private_dir(self.folder)
                private_dir(self.folder / name[:2])
                atomic_write(self.path(name), data)  # bytes and name durable before anyone names the picture
                self._known[digest] = name
                if transient:
                    self._transient_sizes()[name] = len(data)  # scanned already by _make_room
            else:
                path = self.path(name)
                if _size(path) != len(data):  # a copy damaged outside Parley: this put heals it
                    atomic_write(path, data)
                _touch(path)  # a use: LRU and age count from now
                if not transient and self._is_transient(name):
                    self._unmark(name)
            if hold is not None:
                hold.names.append(name)
                self._held[name] = self._held.get(name, 0) + 1
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

    def _transient_sizes(self) -> dict[str, int]:
        """The transient pictures' sizes by name, scanned from the marks on first use."""
        if self._sizes is not None:
            return self._sizes
        sizes: dict[str, int] = {}
        try:
            marked = [e.name for e in os.scandir(self.marks) if NAME_RE.match(e.name)]
        except FileNotFoundError:
            marked = []
        for name in marked:
            try:
                sizes[name] = self.path(name).stat().st_size
            except OSError:
                (self.marks / name).unlink(missing_ok=True)  # the file went; so does its mark
        self._sizes = sizes
        return sizes

    def _make_room(self, need: int) -> None:
        """Before `need` bytes of a new transient picture are written: prune the oldest transient
        pictures not held (to 90% of the cap, so not on every put) until the new one fits under
        the cap and above the free-space floor; else refuse (nothing is written)."""
        cap = self.max_transient_bytes
        if need > cap:
            raise PictureSpaceError(
                f"The picture is {_amount(need)}, more than the {_amount(cap)} this server "
                f"keeps for pictures sent to it.",
                too_big=True,
            )
        sizes = self._transient_sizes()
        total = sum(sizes.values())
        short = self._below_floor(need)
        if total + need <= cap and short <= 0:
            return
        goal = min(total, int(cap * 0.9) - need) if total + need > cap else total  # transient bytes to keep
        freed = 0
        for _, name in sorted((_mtime(self.path(n)), n) for n in sizes):
            if total <= goal and freed >= short:
                break
            if not self._is_transient(name):  # kept since (the window imported it): not ours to count
                total -= sizes.pop(name, 0)
                continue
            if self._held.get(name):
                continue
            try:
                self.path(name).unlink(missing_ok=True)
            except OSError:
                continue
            size = sizes.get(name, 0)
            total, freed = total - size, freed + size
            self._unmark(name)
            self._known.pop(name[:64], None)
            self.pruned += 1
        if total + need > cap:
            raise PictureSpaceError(
                f"No room for this picture now: the {_amount(cap)} kept for pictures sent to "
                f"this server are all in use by turns in progress; retry in a moment."
            )
        if self._below_floor(need) > 0:
            raise PictureSpaceError(
                f"No room for this picture: the disk holding {self.folder} has "
                f"{_amount(_free(self.folder))} free, and pictures sent to this server "
                f"leave at least {_amount(self.min_free_bytes)} free."
            )

    def _below_floor(self, need: int) -> int:
        """Bytes the disk would go below the free-space floor by, with `need` more written."""
        if self.min_free_bytes <= 0:
            return 0
        return max(0, self.min_free_bytes - (_free(self.folder) - need))

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


def _amount(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n:,} bytes"


def _free(folder: Path) -> int:
    """Free bytes on the disk that holds `folder` (its nearest existing parent)."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


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
