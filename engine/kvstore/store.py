"""KVStore: the SSD block store the engine spills idle sessions to and restores them from.

A thin facade over a one-way chain: pure pieces (keys, blob, layout, manifest, restore planning),
the index (index.py: manifest, pins, counters, lock, eviction, job commit, sweep), spill jobs
(spill_job.py) and the blob reader (reader.py). This file only wires them together.

Threads: begin_spill / SpillJob.step / restore / the version calls run on the caller's
(model-owner) thread; blob writes, the manifest commit, refcount release and eviction run on the
store's writer thread.
"""

from __future__ import annotations

import errno
import math
import os
import sqlite3
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from ..pictures.span import PictureSpan
from ..platform.files import FolderBusy, FolderLock, sync_dir as fsync_dir
from ..platform.paths import PRIVATE_DIR_MODE, private_dir
from .blob import KIND_BLOCK, KIND_TAIL, blob_size
from .errors import BadBlob, KVStoreError, MissingBlob, StoreUnavailable
from .index import StoreIndex
from .keys import ZERO_KEY, block_keys, namespace_digest, normalize_pictures, normalize_tokens, tail_key
from .layout import KVLayout, build_cache, inspect_cache
from .manifest import encode_state
from .reader import BlobReader, read_layout, read_prefix
from .restore import RestoreResult, RestoreStats, plan_reads
from .session_restore import SessionRestoreJob, kv_bytes
from .spill_job import SpillJob
from .spill_records import BlobPlan, SpillResult
from .sweep import free_bytes, is_damage, open_manifest, unavailable_reason, verify
from .versions import RowMatch, conversation_of, prefix_key, row_matches, row_prefix_key, version_id
from .writer import BufferPool, WriterThread

# errors that say the disk (not the store) is the problem: full, over quota, read-only
_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}

GiB = 1 << 30
DEFAULT_CAP = 20 * GiB


@dataclass(frozen=True)
class StoredSession:
    """A session this store can restore (its row was written under the store's namespace)."""

    id: str
    n_tokens: int
    disk_bytes: int  # its blobs on disk (shared ones counted in full)
    last_used: float
    layout: KVLayout

    def memory_bytes(self, dtype: torch.dtype | None = None) -> int:
        """Memory its KV takes once restored (in `dtype`, else as stored)."""
        return kv_bytes(self.layout, self.n_tokens, dtype)


def default_cap(free: int, held: int) -> int:
    """The store's one size rule, for a disk with `free` bytes free and a store already holding
    `held`: 10% of what the store could use, at most 20 GiB (1 GiB if the disk cannot be measured)."""
    return min(DEFAULT_CAP, (free + held) // 10) or 1 * GiB


def default_floor(cap: int) -> int:
    """Free space a spill leaves on the disk: a quarter of the cap, at most 1 GiB."""
    return min(1 * GiB, cap // 4)


class KVStore:
    """SSD KV block store.

    root: directory (created); holds manifest.sqlite, blobs/xx/<key>.kvb and a lock file.
    namespace: model fingerprint bytes (config, weights identity, dtype, cache layout); part of
        every key, so blobs of different models never mix. Overridable per call.
    max_bytes: size cap; min_free_bytes: free-space floor on the filesystem (spills that would
        cross it evict LRU sessions first and fail cleanly if that is not enough). Left None,
        they follow default_cap and default_floor.
    durable: fsync files and directories (tests of logic may turn it off; never in the app).
    """

    def __init__(
        self,
        root: str,
        namespace: bytes | str = b"",
        *,
        block_tokens: int = 256,
        unit_bytes: int = 32 << 20,
        max_bytes: int | None = None,
        min_free_bytes: int | None = None,
        pin_memory: bool | None = None,
        durable: bool = True,
    ):
        if block_tokens < 1:
            raise ValueError("block_tokens must be >= 1")
        self.root = os.path.abspath(root)
        self.namespace = namespace.encode() if isinstance(namespace, str) else bytes(namespace)
        self.block_tokens = int(block_tokens)
        self.unit_bytes = max(4096, int(unit_bytes))
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
            manifest, reset = open_manifest(self.root)
        except StoreUnavailable:
            self._lock_file.close()
            raise
        except Exception as e:
            self._lock_file.close()
            raise KVStoreError(f"KV store manifest in {self.root} cannot be opened: {e}") from e
        self.index = StoreIndex(manifest, self.root, self.blobs_dir, reset)
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
        self._listing: tuple[int, list[StoredSession]] | None = None  # (index generation, sessions)
        try:
            self.sweep_report = self.index.sweep()
            self.set_cap(max_bytes, min_free_bytes)  # a cap lowered since the last start evicts: a write too
        except Exception as e:
            self._writer.stop()
            self.index.close()
            self._lock_file.close()
            # the sweep's first write is the reconcile transaction: a full disk fails it before
            # any file is deleted, and the store is whole when space returns
            if isinstance(e, sqlite3.Error) and not is_damage(e):
                raise StoreUnavailable(unavailable_reason(self.root, e)) from e
            raise

    def set_cap(self, max_bytes: int | None = None, min_free_bytes: int | None = None) -> int:
        """Size cap and free-space floor, None: default_cap / default_floor. Called at open and
        whenever the settings change; a lower cap evicts now. Returns the sessions evicted."""
        if max_bytes is None:
            max_bytes = default_cap(free_bytes(self.root), self.index.totals()[1])
        if min_free_bytes is None:
            min_free_bytes = default_floor(max_bytes)
        return self.index.set_limits(max_bytes, min_free_bytes)  # evictions bump the index generation

    @property
    def max_bytes(self) -> int:
        return self.index.max_bytes

    @property
    def min_free_bytes(self) -> int:
        return self.index.min_free_bytes

    # ------------------------------------------------------------------ setup / teardown
    def _make_dirs(self) -> None:
        """The store's folders, private (0700) whatever the data folder around them is (the
        user may have chosen an open one) and whatever an older version left."""
        created = not os.path.isdir(self.blobs_dir)
        private_dir(self.root)
        private_dir(self.blobs_dir)
        fan_out = [os.path.join(self.blobs_dir, f"{i:02x}") for i in range(256)]
        for d in fan_out:  # made once, so a blob write never creates a directory
            if not os.path.isdir(d):
                os.mkdir(d, PRIVATE_DIR_MODE)
                created = True
        if os.name == "posix" and os.stat(fan_out[0]).st_mode & 0o077:  # left open by an older version
            for d in fan_out:
                private_dir(d)
        if created and self.durable:
            fsync_dir(self.blobs_dir)
            fsync_dir(self.root)

    def close(self) -> None:
        """Finish queued writes, cancel jobs whose copies were never completed, release the lock."""
        if self._closed:
            return
        self.index.cancel_jobs()
        self._writer.flush()
        self._writer.stop()
        if self._reader is not None:
            self._reader.shutdown(wait=True)
        self._closed = True
        self.index.close()
        self._lock_file.close()

    def __enter__(self) -> KVStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ reads
    def _ns(self, namespace: bytes | str | None) -> bytes:
        return namespace_digest(self.namespace if namespace is None else namespace, self.block_tokens)

    def release_buffers(self) -> bool:
        """Give the spill buffers' host memory back (e.g. when idle); the next spill reallocates.
        Does nothing while a spill job is in flight."""
        if not self.index.idle():
            return False
        self._pool = BufferPool(self._buffer_bytes, count=2, pin=self._pin)
        return True

    def known_blob(self, key: bytes, size: int | None = None) -> bool:
        """The manifest has the blob and its file is present with the right size (a stat, no read)."""
        row = self.index.blob_size(key)
        return row is not None and (size is None or row == size) and self.index.file_size(key) == row

    @property
    def counters(self) -> dict:
        """A snapshot: spills, blocks_written, reused_blobs, ..., bytes_on_disk, blobs_on_disk."""
        out = self.index.counters()
        out["host_buffer_bytes"] = self._pool.allocated_bytes
        return out

    def sessions(self) -> list[str]:
        return self.index.session_ids()

    def stored_sessions(self) -> list[StoredSession]:
        """The sessions a restore under this store's namespace can use, most recently used first
        (read again from the manifest only after a spill, drop or eviction changed them)."""
        if self._listing is not None and self._listing[0] == self.index.generation:
            return self._listing[1]
        generation, rows = self.index.sessions_of(self._ns(None), self.block_tokens)
        listing = sorted(
            (StoredSession(r.id, r.n_tokens, r.bytes, r.last_used, r.layout) for r in rows), key=lambda s: -s.last_used
        )
        self._listing = (generation, listing)
        return listing

    def session_info(self, session_id: str) -> dict | None:
        row = self.index.session(session_id)
        if row is None:
            return None
        return {
            "n_tokens": row.n_tokens,
            "blocks": len(row.block_keys),
            "tail_tokens": row.tail_tokens,
            "bytes": row.bytes,
            "last_used": row.last_used,
            "state": row.state,
            "block_keys": list(row.block_keys),
            "tail_key": row.tail_key,
            "pictures": list(row.pictures),
            "layout": row.layout,
        }

    # ------------------------------------------------------------------ versions (versions.py)
    def row_matches(
        self, conversation_id: str, token_ids: Any, picture_spans: Iterable[PictureSpan] = ()
    ) -> list[RowMatch]:
        """The conversation's own row (first, when stored) and its version rows, each with how
        long an opening of these tokens it holds (no blob is read; versions.best_of picks one)."""
        ns = self._ns(None)
        _, rows = self.index.sessions_of(ns, self.block_tokens)
        tokens, pictures = normalize_tokens(token_ids), normalize_pictures(picture_spans)
        return row_matches(rows, conversation_id, ns, tokens, pictures, self.block_tokens)

    def version_id(self, conversation_id: str, token_ids: Any, picture_spans: Iterable[PictureSpan] = ()) -> str:
        """The row name of the conversation's version holding exactly these tokens."""
        tokens, pictures = normalize_tokens(token_ids), normalize_pictures(picture_spans)
        return version_id(conversation_id, prefix_key(self._ns(None), tokens, pictures, self.block_tokens))

    def keep_as_version(self, session_id: str) -> str | None:
        """Keep a session's row also as a version row of its conversation (a new row naming the
        same blobs: nothing is read or written but the manifest). Returns its name, None when the
        store holds no row of that session."""
        row = self.index.session(session_id)
        if row is None:
            return None
        vid = version_id(conversation_of(session_id), row_prefix_key(row))
        return vid if self.index.copy_session(session_id, vid) else None

    def drop_session(self, session_id: str) -> bool:
        """Forget a session (e.g. the conversation was deleted); its unshared blobs are removed."""
        return self.index.drop_session(session_id)

    def sweep(self) -> dict:
        """Remove temp files and unreferenced blob files; reconcile refcounts (index.sweep)."""
        return self.index.sweep()

    def verify(self) -> dict:
        """Deep check (reads every referenced blob): tests and diagnostics, not the hot path."""
        rows, blobs = self.index.snapshot()
        return verify(rows, blobs, self.index.path)

    # ------------------------------------------------------------------ spill
    def begin_spill(
        self,
        session_id: str,
        token_ids: Any,
        picture_spans: Iterable[PictureSpan] = (),
        cache: Any = None,
        state: dict | None = None,
        *,
        namespace: bytes | str | None = None,
    ) -> SpillJob:
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
        path = self.index.path
        plans = [BlobPlan(k, KIND_BLOCK, i * B, (i + 1) * B, blob_size(layout, B), path(k)) for i, k in enumerate(keys)]
        if n > nb * B:
            tk = tail_key(ns, keys[-1] if keys else ZERO_KEY, tokens, nb * B, pictures)
            plans.append(BlobPlan(tk, KIND_TAIL, nb * B, n, blob_size(layout, n - nb * B), path(tk)))

        def make_job(missing: int) -> SpillJob:
            return SpillJob(
                self.index,
                self._writer,
                self._pool,
                durable=self.durable,
                block_tokens=B,
                session_id=session_id,
                ns=ns,
                tokens=tokens,
                pictures=pictures,
                layout=layout,
                kv=kv,
                plans=plans,
                state_json=state_json,
                missing=missing,
            )

        job, error = self.index.begin_job(session_id, plans, make_job)
        if error:
            job.fail(error)
            job.step()  # hands the failed job to the writer, which reports it
        return job

    def spill(
        self,
        session_id: str,
        token_ids: Any,
        picture_spans: Iterable[PictureSpan] = (),
        cache: Any = None,
        state: dict | None = None,
        *,
        namespace: bytes | str | None = None,
    ) -> SpillResult:
        """begin_spill + all copies + wait."""
        job = self.begin_spill(session_id, token_ids, picture_spans, cache, state, namespace=namespace)
        job.run_copies()
        return job.result()

    # ------------------------------------------------------------------ restore
    def begin_session_restore(
        self,
        session_id: str,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        blobs: int | None = None,
    ) -> SessionRestoreJob | None:
        """Start restoring a session's own stored KV, all of it (or its first `blobs`), one blob per
        step() (no prompt needed: each blob is checked against its chained key). None when the
        store holds no row of it under this namespace. Its blobs stay pinned until the job finishes
        or is cancelled."""
        ns = self._ns(None)
        row = self.index.pin_session(session_id, ns, self.block_tokens)
        if row is None:
            return None

        def failed(item, why: str, detail: str) -> None:
            self.index.blob_failed(item.key, why, detail)

        def done(job: SessionRestoreJob) -> None:
            self.index.unpin_reads(row.keys())
            if job.done_tokens and not job.cancelled and not job.probe:  # counted only when used
                self.index.restored(job.done_tokens, job.bytes_read, session_id)

        try:
            return SessionRestoreJob(row, ns, self.index.path, device, dtype, failed, done, blobs)
        except BaseException:
            self.index.unpin_reads(row.keys())
            raise

    def restore(
        self,
        session_id: str | None,
        token_ids: Any,
        picture_spans: Iterable[PictureSpan] = (),
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        *,
        namespace: bytes | str | None = None,
        max_tokens: int | None = None,
        shared: bool = True,
        cut_pictures: bool = True,
        skip_tokens: int = 0,
    ) -> RestoreResult:
        """Restore the longest verified prefix of `token_ids` (and pictures) the store holds.

        Uses the session's own blocks and tail, and (shared=True) any session's blocks whose
        chained keys match the given tokens, so a new conversation with a known opening restores
        it. max_tokens caps the prefix (the engine passes len(prompt) - 1, leaving one token to
        prefill). cut_pictures: never end inside a picture span. dtype: cast on the way in.
        `state` is the session row's state when its row was usable; stats.state_complete
        says whether that state describes exactly n_tokens tokens. Bad or missing blobs are
        counted and end the prefix; they are never served. skip_tokens: the caller holds that
        opening already; only the whole blocks after it are read (result.start says where the
        restored tokens begin, a block boundary at or before skip_tokens)."""
        t0 = time.perf_counter()
        tokens = normalize_tokens(token_ids)
        pictures = normalize_pictures(picture_spans)
        ns = self._ns(namespace)
        B = self.block_tokens
        limit = len(tokens) if max_tokens is None else max(0, min(len(tokens), int(max_tokens)))
        keys = block_keys(ns, tokens, pictures, B, limit_blocks=math.ceil(limit / B))
        stats = RestoreStats()

        def done(cache: Any = None, n: int = 0, state: dict | None = None) -> RestoreResult:
            stats.seconds = time.perf_counter() - t0
            return RestoreResult(cache, n, state or {}, stats)

        def failed(key: bytes, why: str, detail: str) -> None:
            if why == "missing":
                stats.missing_blobs += 1
            else:
                stats.bad_blobs += 1
            self.index.blob_failed(key, why, detail)

        choice = self.index.pin_for_restore(session_id, keys, ns, B, limit, shared)
        row = choice.row
        try:
            if row is not None:
                stats.session_tokens = row.n_tokens
            if not choice.pins:
                return done()
            stats.source = choice.source
            try:
                layout = row.layout if row is not None else read_layout(self.index.path(choice.chain[0]))
            except (BadBlob, MissingBlob) as e:
                failed(choice.chain[0], "missing" if isinstance(e, MissingBlob) else "bad", str(e))
                return done()
            skip = min(max(0, skip_tokens) // B, len(choice.chain))
            plan = plan_reads(choice, tokens, pictures, limit, B, cut_pictures, self.index.path, skip)
            if not plan.items:
                return done()
            if self._reader is None:
                self._reader = ThreadPoolExecutor(BlobReader.DEPTH, thread_name_prefix="kvstore-read")
            out = read_prefix(
                plan, layout, device, dtype, self._reader, lambda item, why, detail: failed(item.key, why, detail)
            )
            stats.blobs_read = out.blobs_read
            stats.bytes_read = out.bytes_read
            if out.tensors is None:  # nothing verified (n_tokens == 0)
                return done()
            n = plan.first + out.n_tokens
            stats.state_complete = bool(row is not None and n == row.n_tokens)
            own = session_id if row is not None and choice.from_own else None
            self.index.restored(out.n_tokens, out.bytes_read, own)
            result = done(build_cache(out.tensors), n, row.state if row is not None else {})
            result.start = plan.first
            return result
        finally:
            self.index.unpin_reads(choice.pins)
