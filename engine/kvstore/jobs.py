"""A store's in-flight spill jobs: registering a planned job (its keys pinned against deletion, its
session protected from eviction) and, on the writer thread after its last unit, committing it to
the manifest or cleaning up after it."""
from __future__ import annotations

import logging
import time
from collections import Counter
from typing import TYPE_CHECKING

from .blob import KIND_BLOCK, KIND_TAIL
from .errors import KVStoreError
from .eviction import collect_garbage, evict
from .manifest import SessionRow
from ..platform_io import sync_dir
from .writer import unlink_quiet

if TYPE_CHECKING:
    from .spill import SpillJob
    from .store import KVStore

log = logging.getLogger(__name__)


def register_job(store: "KVStore", job: "SpillJob") -> None:
    """With the store's lock held, before the job's first copy."""
    store._spill_pins.update(p.key for p in job.plans)
    store._active[job.session_id] += 1
    store._jobs.add(job)


def _unregister(store: "KVStore", job: "SpillJob") -> None:
    store._spill_pins.subtract(p.key for p in job.plans)
    store._spill_pins += Counter()  # drop zero counts
    store._active[job.session_id] -= 1
    if store._active[job.session_id] <= 0:
        del store._active[job.session_id]
    store._jobs.discard(job)


def finish_job(store: "KVStore", job: "SpillJob") -> None:
    """Writer thread: after the job's last unit. Commit it, or clean it up. Always completes
    the job (a waiter must never hang)."""
    ok = False
    try:
        if not job.failed:
            try:
                if store.durable:
                    for d in sorted(job.dirs):
                        sync_dir(d)  # the renames are durable before the row naming them
                _install(store, job)
                ok = True
            except Exception as e:
                job.fail(f"installing the session failed: {e}")
        with store._lock:
            job._discard_open()
            _unregister(store, job)
            if ok:  # eviction happens after the new row is installed
                collect_garbage(store)
                job.stats.evicted_sessions = evict(store, {job.session_id})
            else:
                store._counters["spill_failures"] += 1
                _remove_uninstalled(store, job)
    except Exception:
        log.exception("kvstore: cleanup after a spill failed")  # the startup sweep tidies up
    finally:
        job._complete(ok)


def _install(store: "KVStore", job: "SpillJob") -> None:
    blocks = [p.key for p in job.plans if p.kind == KIND_BLOCK]
    tail = next((p for p in job.plans if p.kind == KIND_TAIL), None)
    row = SessionRow(id=job.session_id, namespace=job.ns, block_tokens=store.block_tokens, block_keys=blocks,
                     tail_key=tail.key if tail else None, tail_tokens=tail.n if tail else 0,
                     n_tokens=len(job.tokens), pictures=job.pictures, layout=job.layout,
                     state_json=job.state_json, bytes=sum(p.size for p in job.plans),
                     last_used=time.time())
    written = [(p.key, p.size, p.kind) for p in job.written]
    referenced = [(p.key, p.size, p.kind) for p in job.plans if not p.write]
    with store._lock:
        store._check_open()
        if job.failed:  # e.g. dropped meanwhile; checked under the lock drop_session holds
            raise KVStoreError(job.failed)
        # old blobs only this session held go in the same transaction, their files right after
        freed = store._manifest.install(row, written, referenced,
                                        keep=lambda k: store._spill_pins[k] > 0 or store._read_pins[k] > 0)
        for key in freed:
            unlink_quiet(store._path(key))
        s = job.stats
        c = store._counters
        c["spills"] += 1
        c["blocks_written"] += s.blocks_written
        c["tails_written"] += s.tail_written
        c["reused_blobs"] += s.reused_blobs
        c["reused_bytes"] += s.reused_bytes
        c["missing_blobs"] += s.missing_blobs
        c["bytes_written"] += s.bytes_written


def _remove_uninstalled(store: "KVStore", job: "SpillJob") -> None:
    """A failed job's renamed files that no manifest row or other job references."""
    keys = [p.key for p in job.written]
    rows = store._manifest.blob_sizes(keys)
    for p in job.written:
        if p.key not in rows and not store._spill_pins[p.key] and not store._read_pins[p.key]:
            unlink_quiet(p.path)
