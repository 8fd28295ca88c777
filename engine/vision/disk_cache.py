"""Disk tier of the image cache: features that survive encoder unloads and app restarts.

diskcache gives a size-capped store with its own eviction. Each value carries a BLAKE3 of its
payload, so a damaged entry reads as a miss (and is deleted), never as wrong features.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import blake3
import diskcache
from safetensors.torch import load as st_load, save as st_save

from ..pictures.span import PictureKey
from ..platform.paths import private_dir, private_file, private_opener
from .entry import PictureEntry

log = logging.getLogger(__name__)

MAGIC = b"PRLYIMG1"


class _PrivateDisk(diskcache.Disk):
    """diskcache's value files, made 0600 in 0700 folders (its own are 0644 and 0755): features
    reveal the pictures they came from."""

    def _write(self, full_path, iterator, mode, encoding=None):
        full_dir = os.path.dirname(full_path)
        for count in range(1, 11):  # as diskcache's own: another cache may remove the folder meanwhile
            try:
                folder = self._directory
                for part in os.path.relpath(full_dir, folder).split(os.sep):
                    folder = os.path.join(folder, part)
                    if not os.path.isdir(folder):
                        os.mkdir(folder, 0o700)
                writer = open(full_path, mode, encoding=encoding, opener=private_opener)  # noqa: SIM115 - closed below, as diskcache does
            except OSError:
                if count == 10:
                    raise
                continue
            with writer:
                size = 0
                for chunk in iterator:
                    size += len(chunk)
                    writer.write(chunk)
                return size
        return None


def pack(entry: PictureEntry) -> bytes:
    """The stored form of `entry`, features included (put() passes only entries that have them)."""
    if entry.features is None:
        raise ValueError(f"picture {entry.key!r} has no features to keep")
    payload = st_save({"features": entry.features.contiguous()}, metadata={"meta": json.dumps(entry.meta())})
    return MAGIC + blake3.blake3(payload).digest() + payload


def unpack(key: PictureKey, blob: bytes) -> PictureEntry | None:
    if not isinstance(blob, (bytes, bytearray)) or len(blob) < 40 or blob[:8] != MAGIC:
        return None
    digest, payload = blob[8:40], bytes(blob[40:])
    if blake3.blake3(payload).digest() != digest:
        return None
    try:
        header_len = int.from_bytes(payload[:8], "little")
        meta = json.loads(json.loads(payload[8 : 8 + header_len])["__metadata__"]["meta"])
        features = st_load(payload)["features"]
    except Exception:
        return None
    if features.dim() != 2 or features.shape[0] != meta["n_tokens"]:
        return None
    return PictureEntry(
        key=key,
        replacement=meta["replacement"],
        n_tokens=meta["n_tokens"],
        grid_thw=meta.get("grid_thw"),
        features=features,
        modality=meta.get("modality", "image"),
        second_per_grid=meta.get("second_per_grid"),
    )


class DiskImageCache:
    """Size-capped, crash-tolerant; `available` is False when the folder cannot be used."""

    def __init__(self, folder: Path, size_limit: int):
        self.folder = folder
        self.size_limit = size_limit
        self.error: str | None = None
        self.damaged = 0
        self._cache: diskcache.Cache | None = None
        if size_limit <= 0:
            self.error = "disabled"
            return
        try:
            private_dir(folder)  # features reveal the pictures: the user's alone
            # SQLite gives -wal and -shm the database's mode; an older version's are tightened too
            for db in ("cache.db", "cache.db-wal", "cache.db-shm"):
                if db == "cache.db" or (folder / db).exists():
                    private_file(folder / db)
            self._cache = diskcache.Cache(
                str(folder), size_limit=size_limit, eviction_policy="least-recently-used", disk=_PrivateDisk
            )
            probe = b"parley-probe"
            self._cache.set(probe, b"ok")
            self._cache.delete(probe)
        except Exception as exc:  # unwritable, a file in the way, a full disk...
            self.error = f"{folder}: {exc}"
            self._cache = None

    @property
    def available(self) -> bool:
        return self._cache is not None

    def get(self, key: PictureKey) -> PictureEntry | None:
        if self._cache is None:
            return None
        try:
            blob = self._cache.get(key)
        except Exception as exc:
            log.warning("image disk cache read failed: %s", exc)
            return None
        if blob is None:
            return None
        entry = unpack(key, blob)
        if entry is None:
            self.damaged += 1
            try:
                self._cache.delete(key)
            except Exception:
                pass
        return entry

    def put(self, entry: PictureEntry) -> bool:
        if self._cache is None or entry.features is None:
            return False
        try:
            self._cache.set(entry.key, pack(entry))
            return True
        except Exception as exc:
            log.warning("image disk cache write failed: %s", exc)
            return False

    def contains(self, key: PictureKey) -> bool:
        return self._cache is not None and key in self._cache

    @property
    def nbytes(self) -> int:
        if self._cache is None:
            return 0
        try:
            return int(self._cache.volume())
        except Exception:
            return 0

    def __len__(self) -> int:
        return 0 if self._cache is None else len(self._cache)

    def close(self) -> None:
        if self._cache is not None:
            self._cache.close()
