"""The store folder on disk: opening the manifest (a full disk is not damage), listing blob files
for the startup sweep (index.StoreIndex.sweep), free space, and the deep check of blob files.

The sweep decides from the manifest and a directory listing (names and sizes) only; it never
reads a payload, so it costs the same whatever the store holds.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import blake3

from ..platform.paths import private_file
from .blob import SUFFIX, TMP_SUFFIX, parse_header
from .errors import BadBlob, MissingBlob, StoreUnavailable
from .keys import KEY_BYTES
from .manifest import Manifest, SessionRow
from .writer import unlink_quiet

log = logging.getLogger(__name__)


# SQLite primary result codes that mean the file itself is damaged (everything else, e.g. FULL,
# IOERR, READONLY, CANTOPEN, BUSY, says the file is fine and the disk or the OS is not)
_DAMAGED = {11, 26}  # SQLITE_CORRUPT, SQLITE_NOTADB


def is_damage(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:  # raised by our own code (schema check) or without a code: treat as damage
        return not isinstance(exc, sqlite3.OperationalError)
    return code & 0xFF in _DAMAGED


def open_manifest(root: str) -> tuple[Manifest, bool]:
    """Open the manifest. Returns (manifest, reset).

    Only a manifest that is really damaged (SQLite says corrupt / not a database, or its
    integrity check fails) is set aside and replaced by an empty one (the store is a cache: the
    sweep then removes blobs nobody references). A disk that is full, read-only or failing
    raises StoreUnavailable and changes nothing, so the store is whole when space returns."""
    path = os.path.join(root, "manifest.sqlite")
    try:
        private_file(path)  # SQLite gives its -wal and -shm files the database file's mode
        m = Manifest(path)
    except sqlite3.Error as e:
        if not is_damage(e):
            raise StoreUnavailable(unavailable_reason(root, e)) from e
    else:
        try:
            ok = m.db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        except sqlite3.Error as e:
            m.close()
            if not is_damage(e):
                raise StoreUnavailable(unavailable_reason(root, e)) from e
            ok = False
        if ok:
            return m, False
        m.close()
    set_aside(path)
    log.warning("kvstore: manifest in %s failed its integrity check; set aside, starting empty", root)
    private_file(path)
    return Manifest(path), True


def free_bytes(root: str) -> int:
    try:
        return shutil.disk_usage(root).free
    except OSError:
        return 0


def unavailable_reason(root: str, exc: BaseException) -> str:
    """One line: why the store cannot be used now, naming a full disk when it is one."""
    free = free_bytes(root)
    if free < (1 << 20):
        return f"the disk holding {root} is full ({free:,} bytes free)"
    return f"the store in {root} cannot be written ({exc})"


def set_aside(path: str) -> None:
    """Keep one damaged copy for diagnosis (older copies are removed), then clear the name."""
    folder, name = os.path.split(path)
    for old in os.listdir(folder):
        if old.startswith(name + ".corrupt-"):
            unlink_quiet(os.path.join(folder, old))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.replace(path + suffix, f"{path}.corrupt-{stamp}{suffix}")


def list_blob_files(blobs_dir: str, report: dict) -> dict[bytes, int]:
    """key -> size of every blob file; temp files (a write a crash interrupted) are deleted."""
    files: dict[bytes, int] = {}
    for sub in sorted(os.listdir(blobs_dir)):
        d = os.path.join(blobs_dir, sub)
        if not os.path.isdir(d):
            continue
        with os.scandir(d) as it:
            for ent in it:
                if ent.name.endswith(TMP_SUFFIX):
                    if unlink_quiet(ent.path):
                        report["tmp_removed"] += 1
                elif ent.name.endswith(SUFFIX) and len(ent.name) == 2 * KEY_BYTES + len(SUFFIX):
                    try:
                        files[bytes.fromhex(ent.name[: 2 * KEY_BYTES])] = ent.stat().st_size
                    except (ValueError, OSError):
                        pass
    return files


def check_blob_file(path: str, key: bytes) -> None:
    """Read and fully verify one blob; raises MissingBlob or BadBlob."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError as e:
        raise MissingBlob(path) from e
    hdr = parse_header(memoryview(data))
    if hdr.key != key:
        raise BadBlob("key mismatch")
    if len(data) != hdr.header_len + hdr.payload_len:
        raise BadBlob("size mismatch")
    if blake3.blake3(memoryview(data)[hdr.header_len :]).digest() != hdr.payload_digest:
        raise BadBlob("payload checksum mismatch")


def verify(
    rows: list[SessionRow], blobs: dict[bytes, tuple[int, int]], path_of: Callable[[bytes], str]
) -> dict[str, Any]:
    """Deep check (reads every referenced blob) of a manifest snapshot (index.snapshot()): for
    tests and diagnostics, not the hot path."""
    report: dict[str, Any] = {"sessions": 0, "blobs_ok": 0, "bad": [], "missing": [], "refcount_errors": []}
    refs: Counter = Counter()
    for row in rows:
        report["sessions"] += 1
        refs.update(row.keys())
    for key, n in refs.items():
        if key not in blobs:
            report["refcount_errors"].append((key.hex(), "no row"))
        elif blobs[key][1] != n:
            report["refcount_errors"].append((key.hex(), f"refcount {blobs[key][1]} != {n}"))
        try:
            check_blob_file(path_of(key), key)
            report["blobs_ok"] += 1
        except MissingBlob:
            report["missing"].append(key.hex())
        except BadBlob as e:
            report["bad"].append((key.hex(), str(e)))
    return report
