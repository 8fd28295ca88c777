"""Pictures sent inline as data: URLs, stored once per content under the data folder.

A picture is kept as `<data_dir>/api-pictures/<blake3 hex>.<ext>` holding the client's bytes
unchanged, so the same bytes always name the same file and the engine's image cache (keyed by
those bytes) finds a picture the client re-sends. A payload is fully decoded once, the first
time it is seen; a picture already on disk costs one hash and one stat. The folder is
size-capped (least recently used pictures go first, never one used in the last hour).
"""
from __future__ import annotations

import base64
import binascii
import io
import os
import re
import threading
import time
from pathlib import Path

import blake3
from PIL import Image

from ..paths import private_dir
from ..picture_file import PictureError, check
from ..platform_io import atomic_write
from .errors import bad

_DATA_URL = re.compile(r"^data:([^;,]*)((?:;[^;,]*)*),", re.IGNORECASE)
_WS = re.compile(rb"\s+")
_EXT = {"PNG": "png", "JPEG": "jpg", "WEBP": "webp", "GIF": "gif", "BMP": "bmp", "TIFF": "tiff", "MPO": "jpg"}


def decode_data_url(url: str, param: str) -> bytes:
    """`data:image/...;base64,...` -> bytes; anything else is a clear 400."""
    low = url[:16].lower()
    if low.startswith(("http://", "https://")):
        raise bad("Parley does not fetch remote images: send the picture inline as a data URL "
                  "(data:image/png;base64,...).", param, "remote_image_refused")
    m = _DATA_URL.match(url)
    if m is None:
        raise bad("An image_url must be a data URL (data:image/png;base64,...).", param, "invalid_image_url")
    mime, params = m.group(1).strip().lower(), m.group(2).lower()
    if "base64" not in [p.strip() for p in params.split(";")]:
        raise bad("An image data URL must be base64-encoded (data:image/png;base64,...).", param, "invalid_image_url")
    if mime and not mime.startswith("image/"):
        raise bad(f"The payload is not a picture (its data URL says {mime!r}).", param, "invalid_image")
    payload = _WS.sub(b"", url[m.end():].encode("ascii", "replace"))
    payload += b"=" * (-len(payload) % 4)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise bad("The picture's base64 data cannot be decoded.", param, "invalid_base64") from None
    if not data:
        raise bad("The picture's data is empty.", param, "invalid_image")
    return data


class PictureStore:
    """Content-addressed picture files, size-capped: past `max_bytes` the least recently used
    files go, but never one used within `keep_s` (a queued turn may still need it)."""

    def __init__(self, folder: Path, max_bytes: int = 2 << 30, keep_s: float = 3600.0,
                 max_age_s: float = 7 * 86400.0):
        self.folder = Path(folder)
        self.max_bytes = max_bytes
        self.keep_s = keep_s
        self.max_age_s = max(max_age_s, keep_s)  # never expire what a queued turn may still read
        self._lock = threading.Lock()
        self._known: dict[str, Path] = {}  # content hex -> file, for pictures seen by this process
        self._sizes: dict[Path, int] | None = None  # the folder's files, scanned on first write
        self.pruned = 0  # deleted to stay under max_bytes
        self.expired = 0  # deleted by sweep() for age

    @property
    def nbytes(self) -> int:
        with self._lock:
            self._scan()
            return sum(self._sizes.values())

    def put(self, data: bytes, param: str) -> Path:
        """Store `data` (validated as a picture the first time) and return its file."""
        digest = blake3.blake3(data).hexdigest()
        with self._lock:
            known = self._known.get(digest)
        if known is not None and self._touch(known):
            return known
        try:
            fmt = Image.open(io.BytesIO(data)).format or ""
        except Exception:
            fmt = ""
        ext = _EXT.get(fmt.upper(), fmt.lower() or "bin")
        path = self.folder / f"{digest}.{ext}"
        if not self._touch(path):
            try:
                check(data, "The picture")  # a payload that is not a picture (or is damaged) -> 400
            except PictureError as exc:
                raise bad(str(exc), param, "invalid_image") from None
            self._write(path, data)
            with self._lock:
                self._scan()
                self._sizes[path] = len(data)
                if sum(self._sizes.values()) > self.max_bytes:
                    self._prune(keep=path)
        with self._lock:
            self._known[digest] = path
        return path

    @staticmethod
    def _touch(path: Path) -> bool:
        """Mark a stored picture as used now; False when it is not there."""
        try:
            os.utime(path)
            return True
        except OSError:
            return False

    def _scan(self) -> None:
        if self._sizes is not None:
            return
        self._sizes = {}
        try:
            for entry in os.scandir(self.folder):
                if entry.is_file() and not entry.name.startswith("."):
                    self._sizes[Path(entry.path)] = entry.stat().st_size
        except FileNotFoundError:
            pass

    def _prune(self, keep: Path) -> None:
        total = sum(self._sizes.values())
        now = time.time()
        by_age = []
        for path in self._sizes:
            try:
                by_age.append((path.stat().st_mtime, path))
            except OSError:
                by_age.append((0.0, path))
        for mtime, path in sorted(by_age):
            if total <= self.max_bytes * 0.9:
                break
            if path == keep or now - mtime < self.keep_s:
                continue
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError:
                continue
            total -= self._sizes.pop(path)
            self._known = {k: v for k, v in self._known.items() if v != path}
            self.pruned += 1

    def sweep(self) -> int:
        """Delete pictures unused for `max_age_s` and temp files left by a crash; make what stays
        private (0600 in a 0700 folder, whatever an older version left). -> files deleted."""
        now, gone = time.time(), 0
        try:
            os.chmod(self.folder, 0o700)
            entries = list(os.scandir(self.folder))
        except FileNotFoundError:
            return 0
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
                if not entry.is_file(follow_symlinks=False):
                    continue
                tmp = entry.name.startswith(".")
                if now - st.st_mtime > (self.keep_s if tmp else self.max_age_s):
                    os.unlink(entry.path)
                    gone += 1
                    with self._lock:
                        if self._sizes is not None:
                            self._sizes.pop(Path(entry.path), None)
                        self._known = {k: v for k, v in self._known.items() if v != Path(entry.path)}
                elif st.st_mode & 0o077:
                    os.chmod(entry.path, 0o600)
            except FileNotFoundError:
                continue
        self.expired += gone
        return gone

    def _write(self, path: Path, data: bytes) -> None:
        private_dir(self.folder)
        atomic_write(path, data)  # same bytes -> same name: a concurrent writer's copy is identical
