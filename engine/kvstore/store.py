"""KVStore: the SSD block store the engine spills idle sessions to and restores them from.

Threads: begin_spill / SpillJob.step / restore run on the caller's (model-owner) thread; blob
writes, the manifest commit, refcount release and eviction run on the store's writer thread.
Every manifest access happens under one lock. Disk space and eviction: eviction.py; a spill
job's registration and commit: jobs.py.
"""
from __future__ import annotations

import logging
import errno
import os
import sqlite3
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable

import torch

from .blob import KIND_BLOCK, KIND_TAIL, blob_path, blob_size
from .errors import KVStoreError, StoreUnavailable
from .keys import ZERO_KEY, block_keys, namespace_digest, normalize_pictures, normalize_tokens, tail_key
from .eviction import collect_garbage, free_bytes, precheck_space
from .jobs import register_job
from .layout import inspect_cache
from .manifest import encode_state
from .restore import RestoreResult
from .restore import restore as restore_impl
from .spill import BlobPlan, SpillJob, SpillResult
from .sweep import is_damage, open_manifest, unavailable_reason
from .sweep import sweep as sweep_store
from .sweep import verify as verify_store
from ..platform_io import FolderBusy, FolderLock
from ..platform_io import sync_dir as fsync_dir
from .writer import BufferPool, WriterThread, unlink_quiet

log = logging.getLogger(__name__)

# errors that say the disk (not the store) is the problem: full, over quota, read-only
_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}

GiB = 1 << 30
DEFAULT_CAP = 20 * GiB
COUNTER_NAMES = ("spills", "spill_failures", "blocks_written", "tails_written", "reused_blobs",
                 "reused_bytes", "missing_blobs", "bytes_written", "restores", "restored_tokens",
                 "restore_bytes", "bad_blobs", "evicted_sessions")


class Counters(dict):
    """The counters dict; also callable (store.counters() == store.counters) for callers that
    treat it as a method."""

    def __call__(self) -> "Counters":
        return self


class KVStore:
    """SSD KV block store.

    root: directory (created); holds manifest.sqlite, blobs/xx/<key>.kvb and a lock file.
    namespace: model fingerprint bytes (config, weights identity, dtype, cache layout); part of
        every key, so blobs of different models never mix. Overridable per call.
    max_bytes: size cap (default min(20 GiB, 10% of free disk + what the store holds)).
    min_free_bytes: free-space floor on the filesystem; spills that would cross it evict LRU
        sessions first and fail cleanly if that is not enough.
    durable: fsync files and directories (tests of logic may turn it off; never in the app).
    """

    def __init__(self, root: str, namespace: bytes | str = b"", *, block_tokens: int = 256,
                 unit_bytes: int = 32 << 20, max_bytes: int | None = None,
                 min_free_bytes: int = 1 * GiB, pin_memory: bool | None = None, durable: bool = True):
        if block_tokens < 1:
            raise ValueError("block_tokens must be >= 1")
        self.root = os.path.abspath(root)
        self.namespace = namespace.encode() if isinstance(namespace, str) else bytes(namespace)
        self.block_tokens = int(block_tokens)
        self.unit_bytes = max(4096, int(unit_bytes))
        self.min_free_bytes = int(min_free_bytes)
        self.durable = durable
        self.blobs_dir = os.path.join(self.root, "blobs")
        self._closed = False
        try:
            self._make_dirs()
            self._lock_file = FolderLock(os.path.join(self.root, "lock"))  # released by the OS if we die
        except FolderBusy as e:
            raise KVStoreError(f"KV store {self.root} is in use by another process") from e
        except OSError as e:
            if e.errno in _DISK_ERRNOS:
                raise StoreUnavailable(unavailable_reason(self.root, e)) from e
            raise KVStoreError(f"KV store directory {self.root} is not usable: {e}") from e
        try:
            self._manifest, self._manifest_reset = open_manifest(self.root)
        except StoreUnavailable:
            self._lock_file.close()
            raise
        except Exception as e:
            self._lock_file.close()
            raise KVStoreError(f"KV store manifest in {self.root} cannot be opened: {e}") from e
        self._lock = threading.RLock()
        self._spill_pins: Counter = Counter()  # keys referenced by in-flight spill jobs
        self._read_pins: Counter = Counter()   # keys being read by a restore
        self._active: Counter = Counter()      # session ids with an in-flight spill job
        self._jobs: set[SpillJob] = set()
        self._counters: Counter = Counter({k: 0 for k in COUNTER_NAMES})
        if pin_memory is None:
            pin_memory = torch.cuda.is_available()
        # unit_bytes budgets a unit including its share of the spill's bookkeeping (token ids,
        # headers, manifest): the two buffers leave that room, so a spill's whole extra memory
        # stays within 2 * unit_bytes
        self._pin = pin_memory
        self._buffer_bytes = self.unit_bytes - min(self.unit_bytes // 32, 1 << 20)
        self._pool = BufferPool(self._buffer_bytes, count=2, pin=pin_memory)
        self._writer = WriterThread()
        self._reader: ThreadPoolExecutor | None = None
        try:
            self.sweep_report = self.sweep()
        except Exception as e:
            self._writer.stop()
            self._manifest.close()
            self._lock_file.close()
            # the sweep's first write is the reconcile transaction: a full disk fails it before
            # any file is deleted, and the store is whole when space returns
            if isinstance(e, sqlite3.Error) and not is_damage(e):
                raise StoreUnavailable(unavailable_reason(self.root, e)) from e
            raise
        if max_bytes is None:
            _, on_disk, _ = self._manifest.totals()
            max_bytes = min(DEFAULT_CAP, (free_bytes(self.root) + on_disk) // 10)
        self.max_bytes = int(max_bytes)

    # ------------------------------------------------------------------ setup / teardown
    def _make_dirs(self) -> None:
        created = not os.path.isdir(self.blobs_dir)
        os.makedirs(self.blobs_dir, exist_ok=True)
        for i in range(256):  # fan-out made once, so a blob write never creates a directory
            d = os.path.join(self.blobs_dir, f"{i:02x}")
            if not os.path.isdir(d):
                os.mkdir(d)
                created = True
        if created and self.durable:
            fsync_dir(self.blobs_dir)
            fsync_dir(self.root)

    def close(self) -> None:
        """Finish queued writes, cancel jobs whose copies were never completed, release the lock."""
        if self._closed:
            return
        for job in list(self._jobs):
            job.cancel()
        self._writer.flush()
        self._writer.stop()
        if self._reader is not None:
            self._reader.shutdown(wait=True)
        with self._lock:
            self._closed = True
            self._manifest.close()
        self._lock_file.close()

    def __enter__(self) -> "KVStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise KVStoreError("KV store is closed")

    # ------------------------------------------------------------------ helpers
    def _ns(self, namespace: bytes | str | None) -> bytes:
        if namespace is None:
            namespace = self.namespace
        return namespace_digest(namespace, self.block_tokens)

    def _path(self, key: bytes) -> str:
        return blob_path(self.blobs_dir, key)

    def _file_size(self, key: bytes) -> int:
        try:
            return os.stat(self._path(key)).st_size
        except OSError:
            return -1

    def release_buffers(self) -> bool:
        """Give the spill buffers' host memory back (e.g. when idle); the next spill reallocates.
        Does nothing while a spill job is in flight."""
        with self._lock:
            if self._jobs:
                return False
            self._pool = BufferPool(self._buffer_bytes, count=2, pin=self._pin)
            return True

    def known_blob(self, key: bytes, size: int | None = None) -> bool:
        """The manifest has the blob and its file is present with the right size (a stat, no read)."""
        with self._lock:
            row = self._manifest.blob_sizes([key]).get(key)
        return row is not None and (size is None or row == size) and self._file_size(key) == row

    @property
    def counters(self) -> "Counters":
        """A snapshot: spills, blocks_written, reused_blobs, ..., bytes_on_disk, blobs_on_disk."""
        with self._lock:
            n, total, sessions = self._manifest.totals() if not self._closed else (0, 0, 0)
            out = Counters(self._counters)
        out.update(bytes_on_disk=total, blobs_on_disk=n, sessions=sessions,
                   host_buffer_bytes=self._pool.allocated_bytes)
        return out

    def sessions(self) -> list[str]:
        with self._lock:
            return [r.id for r in self._manifest.sessions()]

    def session_info(self, session_id: str) -> dict | None:
        with self._lock:
            row = self._manifest.session(session_id)
        if row is None:
            return None
        return {"n_tokens": row.n_tokens, "blocks": len(row.block_keys), "tail_tokens": row.tail_tokens,
                "bytes": row.bytes, "last_used": row.last_used, "state": row.state,
                "block_keys": list(row.block_keys), "tail_key": row.tail_key,
                "pictures": [(p.start, p.end, p.key) for p in row.pictures], "layout": row.layout}

    def drop_session(self, session_id: str) -> bool:
        """Forget a session (e.g. the conversation was deleted); its unshared blobs are removed."""
        with self._lock:
            self._check_open()
            for job in self._jobs:  # an in-flight spill must not bring the row back
                if job.session_id == session_id:
                    job.fail("session dropped")
            old = self._manifest.drop_session(session_id)
            collect_garbage(self)
        return old is not None

    # ------------------------------------------------------------------ spill
    def begin_spill(self, session_id: str, token_ids: Any, picture_spans: Iterable[Any] = (),
                    cache: Any = None, state: dict | None = None, *,
                    namespace: bytes | str | None = None) -> SpillJob:
        """Plan a spill of `cache` (whose first len(token_ids) tokens are these ids).

        Raises UnsupportedCache for caches that cannot be spilled exactly, ValueError for bad
        arguments. Disk problems (full, unwritable, over the cap) come back as a failed
        SpillResult; the caller's cache is never modified either way."""
        tokens = normalize_tokens(token_ids)
        pictures = normalize_pictures(picture_spans)
        n = len(tokens)
        if n == 0:
            raise ValueError("nothing to spill: no tokens")
        if any(p.end > n for p in pictures):
            raise ValueError("a picture span ends past the last token")
        layout, kv = inspect_cache(cache, n)
        state_json = encode_state(state)  # fails here, before any work, if not serializable
        ns = self._ns(namespace)
        B = self.block_tokens
        keys = block_keys(ns, tokens, pictures, B)
        nb = len(keys)
        plans = [BlobPlan(k, KIND_BLOCK, i * B, (i + 1) * B, blob_size(layout, B), self._path(k))
                 for i, k in enumerate(keys)]
        if n > nb * B:
            tk = tail_key(ns, keys[-1] if keys else ZERO_KEY, tokens, nb * B, pictures)
            plans.append(BlobPlan(tk, KIND_TAIL, nb * B, n, blob_size(layout, n - nb * B), self._path(tk)))
        with self._lock:
            self._check_open()
            rows = self._manifest.blob_sizes(p.key for p in plans)
            old = self._manifest.session(session_id)
            memo = set(old.keys()) if old else set()
            missing = 0
            for p in plans:
                size = rows.get(p.key)
                if size == p.size and self._file_size(p.key) == p.size:
                    p.write = False  # known blob: referenced, neither copied nor written
                elif size is not None or p.key in memo:
                    missing += 1     # the manifest names it but the disk lost it: rewrite now
            job = SpillJob(self, session_id, ns, tokens, pictures, layout, kv, plans, state_json, missing)
            register_job(self, job)
            try:
                error = precheck_space(self, job)
            except Exception as e:  # e.g. a manifest error while evicting: report, don't leak the job
                error = f"checking disk space failed: {e}"
        if error:
            job.fail(error)
            job.step()  # hands the failed job to the writer, which reports it
        return job

    def spill(self, session_id: str, token_ids: Any, picture_spans: Iterable[Any] = (),
              cache: Any = None, state: dict | None = None, *,
              namespace: bytes | str | None = None) -> SpillResult:
        """begin_spill + all copies + wait."""
        job = self.begin_spill(session_id, token_ids, picture_spans, cache, state, namespace=namespace)
        job.run_copies()
        return job.result()

    # ------------------------------------------------------------------ startup sweep
    def sweep(self) -> dict:
        """Remove temp files and blob files the manifest does not reference; reconcile refcounts.
        Decided from the manifest and a directory listing only: no payload is read."""
        with self._lock:
            if self._jobs:  # their temp and renamed files would look like orphans
                raise KVStoreError("sweep while spills are in flight")
            return sweep_store(self)

    # ------------------------------------------------------------------ restore
    def restore(self, session_id: str | None, token_ids: Any, picture_spans: Iterable[Any] = (),
                device: str | torch.device = "cpu", dtype: torch.dtype | None = None, *,
                namespace: bytes | str | None = None, max_tokens: int | None = None,
                shared: bool = True, cut_pictures: bool = True) -> RestoreResult:
        """Restore the longest verified prefix of `token_ids` (and pictures) the store holds.

        Uses the session's own blocks and tail, and (shared=True) any session's blocks whose
        chained keys match the given tokens, so a new conversation with a known opening restores
        it. max_tokens caps the prefix (the engine passes len(prompt) - 1, leaving one token to
        prefill). cut_pictures: never end inside a picture span. dtype: cast on the way in.
        `state` is the session row's state when its row was usable; stats['state_complete']
        says whether that state describes exactly n_tokens tokens. Bad or missing blobs are
        counted and end the prefix; they are never served."""
        return restore_impl(self, session_id, token_ids, picture_spans, device, dtype, namespace,
                            max_tokens, shared, cut_pictures)

    def verify(self) -> dict:
        """Deep check (reads every referenced blob): tests and diagnostics, not the hot path."""
        return verify_store(self)

    def _blob_failed(self, key: bytes, why: str, stats: dict, detail: str = "") -> None:
        with self._lock:
            if why == "missing":
                self._counters["missing_blobs"] += 1
                stats["missing_blobs"] += 1
            else:
                self._counters["bad_blobs"] += 1
                stats["bad_blobs"] += 1
                log.warning("kvstore: discarding bad blob %s: %s", key.hex(), detail)
                # remove it so the next spill sees it missing and rewrites it; never serve it
                if not self._spill_pins[key]:
                    unlink_quiet(self._path(key))

