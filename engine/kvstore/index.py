"""The store's index: the one owner of its shared state.

It holds the manifest, the pins (keys an in-flight spill or a restore is using, which nothing may
delete), the sessions with a spill in flight (never evicted), the counters, the size limits and
the lock that guards all of them. Every operation that reads or changes that state is a method
here and takes the lock itself; no other module sees the lock or the fields.

Threads: spill planning, restores and copies of a row (a version kept) call in from the
model-owner thread, job commits and releases from the writer thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol, TypeVar

from .blob import KIND_BLOCK, KIND_TAIL, blob_path
from .errors import KVStoreError
from .keys import BlockKey
from .manifest import Manifest, SessionRow
from .restore import RestoreChoice, choose_blobs
from .spill_records import BlobPlan, SpillResult
from .sweep import free_bytes, list_blob_files
from .writer import unlink_quiet

log = logging.getLogger(__name__)

COUNTER_NAMES = (
    "spills",
    "spill_failures",
    "blocks_written",
    "tails_written",
    "reused_blobs",
    "reused_bytes",
    "missing_blobs",
    "bytes_written",
    "restores",
    "restored_tokens",
    "restore_bytes",
    "bad_blobs",
    "evicted_sessions",
)


class TrackedJob(Protocol):
    """What the index needs of an in-flight spill job (spill_job.SpillJob)."""

    session_id: str
    plans: list[BlobPlan]
    written: list[BlobPlan]  # the plans whose files were renamed into place
    stats: SpillResult

    @property
    def failed(self) -> str | None: ...
    def fail(self, message: str) -> None: ...
    def cancel(self) -> None: ...


Job = TypeVar("Job", bound=TrackedJob)


class StoreIndex:
    def __init__(self, manifest: Manifest, root: str, blobs_dir: str, manifest_reset: bool = False):
        self.root = root
        self.blobs_dir = blobs_dir
        self.manifest_reset = manifest_reset  # the manifest was damaged and started empty
        self.max_bytes = 0  # set by set_limits once the store knows its size
        self.min_free_bytes = 0
        self._manifest = manifest
        self._lock = threading.RLock()
        self._spill_pins: Counter = Counter()  # keys referenced by in-flight spill jobs
        self._read_pins: Counter = Counter()  # keys being read by a restore
        self._held_back: set[bytes] = set()  # unreferenced keys garbage collection left to their pins
        self._active: Counter = Counter()  # session ids with an in-flight spill job
        self._jobs: set = set()
        self._counters: Counter = Counter({k: 0 for k in COUNTER_NAMES})
        self._generation = 0  # bumped whenever the set of session rows changes
        self._closed = False

    # ------------------------------------------------------------------ lifetime
    def set_limits(self, max_bytes: int, min_free_bytes: int) -> int:
        """New size cap and free-space floor (at open, or changed in the settings while running).
        A lower cap evicts least-recently-used sessions now, so the store is within it at once;
        the floor is kept by the next spill (a disk filled by others must not empty the store).
        Returns the sessions evicted."""
        with self._lock:
            self.max_bytes = int(max_bytes)
            self.min_free_bytes = int(min_free_bytes)
            evicted = 0
            while not self._closed and self._kept_bytes() > self.max_bytes and self._evict_one(set()):
                evicted += 1
            return evicted

    def cancel_jobs(self) -> None:
        """Abandon every job whose copies were not all handed over (store closing)."""
        with self._lock:
            jobs = list(self._jobs)
        for job in jobs:
            job.cancel()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._manifest.close()

    def _check_open(self) -> None:
        if self._closed:
            raise KVStoreError("KV store is closed")

    def idle(self) -> bool:
        """No spill job is in flight."""
        with self._lock:
            return not self._jobs

    # ------------------------------------------------------------------ reads
    def path(self, key: bytes) -> str:
        return blob_path(self.blobs_dir, key)

    def file_size(self, key: bytes) -> int:
        try:
            return os.stat(self.path(key)).st_size
        except OSError:
            return -1

    def totals(self) -> tuple[int, int, int]:
        """(blobs, bytes, sessions) on disk; zeros once closed."""
        with self._lock:
            return self._manifest.totals() if not self._closed else (0, 0, 0)

    def counters(self) -> dict:
        """A snapshot: spills, blocks_written, reused_blobs, ..., bytes_on_disk, blobs_on_disk, and
        held_bytes: of bytes_on_disk, the blobs no session names that a read still holds."""
        with self._lock:
            n, total, sessions = self._manifest.totals() if not self._closed else (0, 0, 0)
            out = dict(self._counters)
            held = self._held_bytes() if not self._closed else 0
        out.update(bytes_on_disk=total, blobs_on_disk=n, sessions=sessions, held_bytes=held)
        return out

    def session_ids(self) -> list[str]:
        with self._lock:
            return [r.id for r in self._manifest.sessions()]

    def session(self, session_id: str) -> SessionRow | None:
        with self._lock:
            return self._manifest.session(session_id)

    @property
    def generation(self) -> int:
        """Changes whenever a session row is installed or dropped (a listing can be kept until then)."""
        with self._lock:
            return self._generation

    def sessions_of(self, ns: bytes, block_tokens: int) -> tuple[int, list[SessionRow]]:
        """(generation, the rows written under this namespace and block size): what a restore can use."""
        with self._lock:
            rows = self._manifest.sessions() if not self._closed else []
            return self._generation, [r for r in rows if r.namespace == ns and r.block_tokens == block_tokens]

    def snapshot(self) -> tuple[list[SessionRow], dict[bytes, tuple[int, int]]]:
        """Every session row and every blob row (key -> (size, refcount)), read together."""
        with self._lock:
            return self._manifest.sessions(), self._manifest.all_blobs()

    def blob_rows(self) -> dict[bytes, tuple[int, int]]:
        """key -> (size, refcount) of every blob the manifest holds."""
        with self._lock:
            return self._manifest.all_blobs()

    def blob_size(self, key: bytes) -> int | None:
        with self._lock:
            return self._manifest.blob_sizes([key]).get(key)

    # ------------------------------------------------------------------ spill jobs
    def begin_job(self, session_id: str, plans: list, make_job: Callable[[int], Job]) -> tuple[Job, str | None]:
        """Mark the plans whose blobs are already on disk (write=False), build the job with the
        count of blobs the manifest names but the disk lost, pin its keys, protect its session from
        eviction, and check the disk has room. All under one lock hold, so nothing deletes a blob
        between finding it and pinning it. Returns (job, why it cannot be written or None)."""
        with self._lock:
            self._check_open()
            rows = self._manifest.blob_sizes(p.key for p in plans)
            old = self._manifest.session(session_id)
            memo = set(old.keys()) if old else set()
            missing = 0
            for p in plans:
                size = rows.get(p.key)
                if size == p.size and self.file_size(p.key) == p.size:
                    p.write = False  # known blob: referenced, neither copied nor written
                elif size is not None or p.key in memo:
                    missing += 1  # the manifest names it but the disk lost it: rewrite now
            job = make_job(missing)
            self._spill_pins.update(p.key for p in job.plans)
            self._active[job.session_id] += 1
            self._jobs.add(job)
            try:
                error = self._precheck_space(job)
            except Exception as e:  # e.g. a manifest error while evicting: report, don't leak the job
                error = f"checking disk space failed: {e}"
        return job, error

    def commit_job(self, job: TrackedJob, row: SessionRow) -> None:
        """Writer thread, the job's files durable: install its session row in one transaction and
        count it. Raises when the job failed meanwhile (checked under the lock drop_session holds)."""
        written = [(p.key, p.size, p.kind) for p in job.written]
        referenced = [(p.key, p.size, p.kind) for p in job.plans if not p.write]
        with self._lock:
            self._check_open()
            if job.failed:  # e.g. dropped meanwhile
                raise KVStoreError(job.failed)
            # old blobs only this session held go in the same transaction, their files right after
            freed = self._manifest.install(row, written, referenced, keep=self._pinned)
            self._generation += 1
            for key in freed:
                unlink_quiet(self.path(key))
            s = job.stats
            c = self._counters
            c["spills"] += 1
            c["blocks_written"] += s.blocks_written
            c["tails_written"] += s.tail_written
            c["reused_blobs"] += s.reused_blobs
            c["reused_bytes"] += s.reused_bytes
            c["missing_blobs"] += s.missing_blobs
            c["bytes_written"] += s.bytes_written

    def release_job(self, job: TrackedJob, installed: bool) -> int:
        """Writer thread, after commit_job (or instead of it): unpin the job. An installed job is
        followed by garbage collection and eviction (returns the sessions evicted); a failed one
        has its renamed files removed unless something else references them."""
        with self._lock:
            self._spill_pins.subtract(p.key for p in job.plans)
            self._spill_pins += Counter()  # drop zero counts
            self._active[job.session_id] -= 1
            if self._active[job.session_id] <= 0:
                del self._active[job.session_id]
            self._jobs.discard(job)
            if installed:  # eviction happens after the new row is installed
                self._collect_garbage()
                return self._evict({job.session_id})
            self._counters["spill_failures"] += 1
            rows = self._manifest.blob_sizes([p.key for p in job.written])
            for p in job.written:
                if p.key not in rows and not self._pinned(p.key):
                    unlink_quiet(p.path)
            self._release_held_back()
            # another spill installed while this one ran could not evict this session's old row:
            # the store comes back under its cap now (the free-space floor is left to the next
            # spill: a failure on a full disk should not empty the store)
            return self._evict(set(), floor=False)

    def copy_session(self, source: str, dest: str) -> bool:
        """Install a copy of `source`'s row as `dest` (refcounts move with it; no blob is
        written). False when there is no `source` row."""
        with self._lock:
            self._check_open()
            row = self._manifest.session(source)
            if row is None:
                return False
            keys = row.keys()
            sizes = self._manifest.blob_sizes(keys)
            # a blob row the disk lost stays lost: only the rows there are named again
            referenced = [(k, sizes[k], KIND_TAIL if k == row.tail_key else KIND_BLOCK) for k in keys if k in sizes]
            copy = replace(row, id=dest, last_used=time.time())
            freed = self._manifest.install(copy, [], referenced, keep=self._pinned)
            self._generation += 1
            for key in freed:  # the blobs only dest's old row held
                unlink_quiet(self.path(key))
        return True

    def drop_session(self, session_id: str) -> bool:
        """Forget a session; its unshared blobs are removed. An in-flight spill of it fails."""
        with self._lock:
            self._check_open()
            for job in self._jobs:  # an in-flight spill must not bring the row back
                if job.session_id == session_id:
                    job.fail("session dropped")
            old = self._manifest.drop_session(session_id)
            self._generation += 1
            self._collect_garbage()
        return old is not None

    # ------------------------------------------------------------------ restores
    def pin_for_restore(
        self, session_id: str | None, keys: list[BlockKey], ns: bytes, block_tokens: int, limit: int, shared: bool
    ) -> RestoreChoice:
        """Choose the blobs a restore reads (restore.choose_blobs) and pin them against deletion
        until unpin_reads(choice.pins)."""
        with self._lock:
            self._check_open()
            row = self._manifest.session(session_id) if session_id is not None else None
            present = self._manifest.blob_sizes(keys) if shared else {}
            choice = choose_blobs(keys, row, present, ns, block_tokens, limit)
            self._read_pins.update(choice.pins)
        return choice

    def pin_session(self, session_id: str, ns: bytes, block_tokens: int) -> SessionRow | None:
        """A session's own row, its blobs pinned against deletion until unpin_reads(row.keys());
        None when the store holds no usable row of it."""
        with self._lock:
            self._check_open()
            row = self._manifest.session(session_id)
            if row is None or row.namespace != ns or row.block_tokens != block_tokens or not row.keys():
                return None
            self._read_pins.update(row.keys())
            return row

    def unpin_reads(self, pins: Sequence[bytes]) -> None:
        with self._lock:
            self._read_pins.subtract(pins)
            self._read_pins += Counter()  # drop zero counts
            self._release_held_back()

    def blob_failed(self, key: bytes, why: str, detail: str = "") -> None:
        """A restore found a blob missing or bad: count it; a bad one is removed (never served
        again; the next spill sees it missing and rewrites it)."""
        with self._lock:
            if why == "missing":
                self._counters["missing_blobs"] += 1
                return
            self._counters["bad_blobs"] += 1
            log.warning("kvstore: discarding bad blob %s: %s", key.hex(), detail)
            if not self._spill_pins[key]:
                unlink_quiet(self.path(key))

    def restored(self, n_tokens: int, nbytes: int, used_session: str | None) -> None:
        """Count a restore; `used_session` (its own blocks were read) becomes most recently used."""
        with self._lock:
            self._counters["restores"] += 1
            self._counters["restored_tokens"] += n_tokens
            self._counters["restore_bytes"] += nbytes
            if used_session is not None and not self._closed:
                try:  # LRU: a restored session is in use; a failed touch must not fail the restore
                    self._manifest.touch(used_session, time.time())
                except Exception as e:
                    log.warning("kvstore: cannot record use of session %s: %s", used_session, e)

    # ------------------------------------------------------------------ startup sweep
    def sweep(self) -> dict:
        """Remove temp files and blob files the manifest does not reference; reconcile refcounts.
        Decided from the manifest and a directory listing only: no payload is read."""
        with self._lock:
            if self._jobs:  # their temp and renamed files would look like orphans
                raise KVStoreError("sweep while spills are in flight")
            report = {
                "tmp_removed": 0,
                "orphans_removed": 0,
                "unreferenced_removed": 0,
                "missing_rows": 0,
                "size_mismatch_removed": 0,
                "manifest_reset": self.manifest_reset,
            }
            files = list_blob_files(self.blobs_dir, report)
            rec = self._manifest.reconcile(files)
            report["missing_rows"] = rec["missing_rows"]  # kept: restores stop there, spills rewrite them
            keep = self._manifest.all_blobs()
            self._collect_garbage()  # rows no session references (and their files)
            report["unreferenced_removed"] = len(rec["unreferenced"])
            for key in rec["size_mismatch"]:
                if unlink_quiet(self.path(key)):  # torn file: the next spill rewrites it
                    report["size_mismatch_removed"] += 1
            for key in files:
                if key not in keep and unlink_quiet(self.path(key)):  # written, never committed
                    report["orphans_removed"] += 1
            return report

    # ------------------------------------------------------------------ disk space (lock held)
    def _pinned(self, key: bytes) -> bool:
        return self._spill_pins[key] > 0 or self._read_pins[key] > 0

    def _collect_garbage(self) -> None:
        """Delete blobs no session references (rows first, then files: a crash in between leaves
        only an orphan file, which the startup sweep removes)."""
        unreferenced = [k for k, _ in self._manifest.unreferenced()]
        cands = [k for k in unreferenced if not self._pinned(k)]
        self._held_back = {k for k in unreferenced if self._pinned(k)}
        if not cands:
            return
        self._manifest.delete_blobs(cands)
        for k in cands:
            unlink_quiet(self.path(k))

    def _release_held_back(self) -> None:
        """Blobs an eviction or drop left because a restore or spill still held them: deleted
        once the last pin is gone (else they would count against the cap until the next spill)."""
        if any(not self._pinned(k) for k in self._held_back):
            self._collect_garbage()

    def _held_bytes(self) -> int:
        """Blobs no session names that only a restore in flight holds: deleted when it ends (one a
        spill in flight holds is named again when that spill installs)."""
        if not self._read_pins:  # most calls (every memory report): no restore in flight, no query
            return 0
        return sum(
            size for key, size in self._manifest.unreferenced() if self._read_pins[key] and not self._spill_pins[key]
        )

    def _kept_bytes(self) -> int:
        """What the store holds once the restores in flight end: what the cap is kept on.
        Counting the held-back blobs too evicted further sessions for bytes about to go anyway
        (a chat read back ahead, evicted meanwhile, took the next least recently used with it)."""
        return self._manifest.totals()[1] - self._held_bytes()

    def _evict_one(self, protect: set[str]) -> bool:
        """Drop the least recently used session that is neither protected nor being spilled."""
        for sid, _ in self._manifest.lru_sessions():
            if sid not in protect and sid not in self._active:
                self._manifest.drop_session(sid)
                self._generation += 1
                self._collect_garbage()
                self._counters["evicted_sessions"] += 1
                return True
        return False

    def _evict(self, protect: set[str], floor: bool = True) -> int:
        """Whole sessions, least recently used first, until under the cap (and above the floor)."""
        evicted = 0
        while True:
            if self._kept_bytes() <= self.max_bytes and (not floor or free_bytes(self.root) >= self.min_free_bytes):
                return evicted
            if not self._evict_one(protect):
                return evicted
            evicted += 1

    def _precheck_space(self, job: TrackedJob) -> str | None:
        """Why `job` cannot be written (over the cap, or below the floor even after evicting), or None."""
        need = sum(p.size for p in job.plans if p.write)
        total = sum(p.size for p in job.plans)
        if total > self.max_bytes:
            return f"session needs {total} bytes on disk, more than the store cap of {self.max_bytes} bytes"
        free = free_bytes(self.root)
        if free - need < self.min_free_bytes:
            # the only way to make room: drop other idle sessions before writing
            while free - need < self.min_free_bytes and self._evict_one({job.session_id}):
                free = free_bytes(self.root)
            if free - need < self.min_free_bytes:
                return (
                    f"not enough free disk space in {self.root}: {free} bytes free, "
                    f"the spill needs {need} and the floor is {self.min_free_bytes}"
                )
        return None
