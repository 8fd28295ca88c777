"""Disk space of a store: the size cap, the free-space floor, deleting blobs no session references
and evicting whole idle sessions, least recently used first.

All of it runs with the store's lock held."""
from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

from .writer import unlink_quiet

if TYPE_CHECKING:
    from .spill import SpillJob
    from .store import KVStore


def free_bytes(root: str) -> int:
    try:
        return shutil.disk_usage(root).free
    except OSError:
        return 0


def collect_garbage(store: "KVStore") -> None:
    """Delete blobs no session references (rows first, then files: a crash in between leaves
    only an orphan file, which the startup sweep removes)."""
    cands = [(k, s) for k, s in store._manifest.unreferenced()
             if not store._spill_pins[k] and not store._read_pins[k]]
    if not cands:
        return
    store._manifest.delete_blobs([k for k, _ in cands])
    for k, _ in cands:
        unlink_quiet(store._path(k))


def evict_one(store: "KVStore", protect: set[str]) -> bool:
    for sid, _ in store._manifest.lru_sessions():
        if sid not in protect and sid not in store._active:
            store._manifest.drop_session(sid)
            collect_garbage(store)
            store._counters["evicted_sessions"] += 1
            return True
    return False


def evict(store: "KVStore", protect: set[str]) -> int:
    """Whole sessions, least recently used first, until under the cap and above the floor."""
    evicted = 0
    while True:
        _, total, _ = store._manifest.totals()
        if total <= store.max_bytes and free_bytes(store.root) >= store.min_free_bytes:
            return evicted
        if not evict_one(store, protect):
            return evicted
        evicted += 1


def precheck_space(store: "KVStore", job: "SpillJob") -> str | None:
    """Why `job` cannot be written (over the cap, or below the floor even after evicting), or None."""
    need = sum(p.size for p in job.plans if p.write)
    total = sum(p.size for p in job.plans)
    if total > store.max_bytes:
        return f"session needs {total} bytes on disk, more than the store cap of {store.max_bytes} bytes"
    free = free_bytes(store.root)
    if free - need < store.min_free_bytes:
        # the only way to make room: drop other idle sessions before writing
        while free - need < store.min_free_bytes and evict_one(store, {job.session_id}):
            free = free_bytes(store.root)
        if free - need < store.min_free_bytes:
            return (f"not enough free disk space in {store.root}: {free} bytes free, "
                    f"the spill needs {need} and the floor is {store.min_free_bytes}")
    return None
