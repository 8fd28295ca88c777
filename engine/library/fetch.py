"""Fetch one file into the HF cache's blobs/ folder, resumably, bounded and verified.

huggingface_hub 2.4 downloads to a process-unique temp file and deletes it on any failure, so a
cancel, a dropped connection beyond its retries, or an app restart starts the file from byte 0
(tests/engine/library/test_models_pull.py::test_hf_client_restarts_from_zero measures it). Here the partial file
keeps a stable name (blobs/<digest>.parley-part); the next attempt asks for the rest with an HTTP
Range request, and the file is renamed into place only after its hash equals the one the Hub
listed (SHA-256 for LFS files, the git blob id for the others). No more than the listed size
is ever written: a body that runs past it is refused at the first byte too many.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

from .hub import DiskFull, LibraryError, NetworkUnreachable, shown_endpoint
from .hub_values import Digest
from .progress import ProgressMeter

CHUNK = 1 << 20
PART_SUFFIX = ".parley-part"
RETRIES = 5
READ_TIMEOUT_S = 20  # a stalled connection counts as dropped (and is retried with Range)


class Cancelled(LibraryError):
    pass


class ChecksumMismatch(LibraryError):
    pass


class WrongSize(LibraryError):
    """The server's bytes are longer or shorter than the size the Hub listed."""


def _hash_prefix(part: Path, h) -> int:
    n = 0
    with open(part, "rb") as f:
        while block := f.read(8 * CHUNK):
            h.update(block)
            n += len(block)
    return n


def _fsync_dir(folder: Path) -> None:
    if os.name == "nt":  # directories cannot be opened for fsync there
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Hasher:
    """The file's hash on a helper thread, one batch behind the network: hashlib releases the GIL, so
    hashing overlaps the next reads instead of adding to them. Chunks are handed over in batches
    of BATCH bytes (few thread hand-offs); order is kept, at most two batches are held."""

    BATCH = 256 << 10  # measured best of 64 KiB / 256 KiB / 1 MiB / 4 MiB on a loaded 2-core machine

    def __init__(self, fresh):
        from concurrent.futures import ThreadPoolExecutor

        self.fresh = fresh  # () -> a new hash object
        self.h = fresh()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sha256")
        self._pending = None
        self._batch: list[bytes] = []
        self._batch_bytes = 0

    def _hash_all(self, chunks: list[bytes]) -> None:
        for c in chunks:
            self.h.update(c)

    def update(self, chunk: bytes) -> None:
        self._batch.append(chunk)
        self._batch_bytes += len(chunk)
        if self._batch_bytes >= self.BATCH:
            self._submit()

    def _submit(self) -> None:
        if self._pending is not None:
            self._pending.result()
        self._pending = self._pool.submit(self._hash_all, self._batch) if self._batch else None
        self._batch, self._batch_bytes = [], 0

    def _settle(self) -> None:
        self._submit()
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def reset(self) -> None:
        self._settle()
        self.h = self.fresh()

    def hexdigest(self) -> str:
        self._settle()
        return self.h.hexdigest()

    def close(self) -> None:
        self._settle()
        self._pool.shutdown(wait=True)


def fetch_blob(
    session,
    url: str,
    headers: dict,
    blob: Path,
    digest: Digest,
    size: int,
    meter: ProgressMeter,
    cancel: threading.Event,
    name: str,
) -> None:
    """Download `url` to `blob` (blobs/<digest>); raises Cancelled / ChecksumMismatch / WrongSize /
    DiskFull / NetworkUnreachable / a huggingface_hub HTTP error. A cancel or a drop keeps the
    partial file; wrong bytes (hash or size) delete it."""
    part = blob.with_name(blob.name + PART_SUFFIX)
    if part.exists() and part.stat().st_size > size:
        part.unlink()
    hasher = _Hasher(lambda: digest.hasher(size))
    try:
        have = _hash_prefix(part, hasher.h) if part.exists() else 0
        if have:
            meter.resumed_from_disk(have)
        try:
            have = _receive(session, url, headers, part, hasher, have, size, meter, cancel, name, blob)
        except WrongSize:
            kept = part.stat().st_size if part.exists() else 0
            part.unlink(missing_ok=True)
            meter.rollback(kept)
            raise
        got = hasher.hexdigest()
    finally:
        hasher.close()
    if have != size or got != digest.hex:
        part.unlink(missing_ok=True)
        meter.rollback(have)
        raise ChecksumMismatch(
            f"{name} failed its {digest.label} check (expected {digest.hex[:12]}…, got "
            f"{got[:12]}…); deleted, nothing published"
        )
    os.replace(part, blob)
    _fsync_dir(blob.parent)


def _receive(
    session,
    url,
    headers,
    part: Path,
    hasher: _Hasher,
    have: int,
    size: int,
    meter: ProgressMeter,
    cancel: threading.Event,
    name: str,
    blob: Path,
) -> int:
    """Append the missing bytes to `part` (Range from `have`), retrying drops; returns bytes on disk.
    A full disk keeps what reached the disk (the next pull re-hashes the part file)."""
    try:
        return _append(session, url, headers, part, hasher, have, size, meter, cancel, name)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        kept = part.stat().st_size if part.exists() else 0
        raise DiskFull(
            f"disk full while writing {name} into {blob.parent}: {kept} of {size} bytes kept "
            f"for the next pull; free {(size - kept) / 1e6:.1f} MB there and pull again"
        ) from None


def _append(
    session,
    url,
    headers,
    part: Path,
    hasher: _Hasher,
    have: int,
    size: int,
    meter: ProgressMeter,
    cancel: threading.Event,
    name: str,
) -> int:
    import httpx2
    from huggingface_hub.utils import hf_raise_for_status

    tries, cut = RETRIES, False  # cut: the server answered, then its body ended early
    with open(part, "ab") as out:
        while have < size:
            if cancel.is_set():
                raise Cancelled(f"cancelled; {name} keeps {have} of {size} bytes for the next pull")
            req = dict(headers)
            if have:
                req["Range"] = f"bytes={have}-"
            before = have
            try:
                timeout = httpx2.Timeout(15, read=READ_TIMEOUT_S)
                with session.stream("GET", url, headers=req, follow_redirects=True, timeout=timeout) as r:
                    if r.status_code == 416:  # nothing at or past `have`: the file is shorter than listed
                        raise WrongSize(
                            f"{name}: the server has only {have} of the {size} bytes the hub listed "
                            f"(shorter than listed); deleted, nothing published"
                        )
                    hf_raise_for_status(r)
                    if have and r.status_code == 200:  # the server ignored Range: start over
                        out.truncate(0)
                        meter.rollback(have)
                        hasher.reset()
                        have = before = 0
                    announced = r.headers.get("Content-Length", "")
                    if announced.isdigit() and have + int(announced) > size:
                        raise _too_long(name, size)
                    cut = True
                    for chunk in r.iter_bytes():  # as received: a drop loses no buffered bytes
                        if have + len(chunk) > size:
                            raise _too_long(name, size)
                        out.write(chunk)
                        hasher.update(chunk)
                        have += len(chunk)
                        meter.add(len(chunk))
                        if cancel.is_set():
                            break
                    cut = False
            except (httpx2.TransportError, ConnectionError) as exc:
                tries = RETRIES if have > before else tries - 1
                if tries <= 0:
                    out.flush()
                    if cut:
                        raise LibraryError(
                            f"{shown_endpoint()} cut {name} short {RETRIES} times in a row ({have} of "
                            f"{size} bytes kept for the next pull): {type(exc).__name__}"
                        ) from None
                    raise NetworkUnreachable(
                        f"network unreachable while fetching {name} ({have} of {size} bytes kept): {exc}"
                    ) from None
                cancel.wait(0.2 * (RETRIES - tries))  # short back-off; a cancel ends it
                continue
            if have > before or cancel.is_set():
                tries = RETRIES
                continue
            tries -= 1  # a whole answer with no byte in it: a server that never gets there
            if tries <= 0:
                raise LibraryError(
                    f"{shown_endpoint()} cut {name} short: {RETRIES} answers in a row brought no "
                    f"byte ({have} of {size} bytes kept for the next pull)"
                )
        out.flush()
        os.fsync(out.fileno())
    return have


def _too_long(name: str, size: int) -> WrongSize:
    return WrongSize(
        f"{name}: the server sent more than the {size} bytes the hub listed for it; deleted, nothing published"
    )
