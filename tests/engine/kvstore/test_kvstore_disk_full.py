"""A full disk is not a damaged store: nothing is set aside or deleted, spilling pauses, and
every conversation the store held is there again once space returns. Only a manifest that
really fails its integrity check is set aside, and only one such copy is kept."""

from __future__ import annotations

import os
import sqlite3

import pytest
import torch

from engine.kvstore import KVStore, StoreUnavailable, sweep as sweep_module
from engine.kvstore.layout import build_cache

NS = b"disk-full-model"
SESSIONS = ("a", "b", "c")


def kv_of(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(1, 2, n, 16, generator=g), torch.randn(1, 2, n, 16, generator=g)) for _ in range(2)]


def toks(n, seed):
    return torch.randint(0, 50_000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def open_store(root):
    return KVStore(str(root), NS, block_tokens=16, min_free_bytes=0, max_bytes=1 << 30)


def fill_store(root):
    with open_store(root) as s:
        for i, sid in enumerate(SESSIONS):
            assert s.spill(sid, toks(40, i), [], build_cache(kv_of(40, i))).ok


def listing(root):
    return sorted(
        os.path.relpath(os.path.join(d, f), root)
        for d, _, fs in os.walk(root)
        for f in fs
        if not f.startswith("manifest.sqlite")
    )


def assert_whole(root):
    with open_store(root) as s:
        assert sorted(s.sessions()) == list(SESSIONS)
        assert not s.sweep_report["manifest_reset"] and s.sweep_report["orphans_removed"] == 0
        v = s.verify()
        assert v["blobs_ok"] == 9 and not v["bad"] and not v["missing"] and not v["refcount_errors"]
        for i, sid in enumerate(SESSIONS):
            back = s.restore(sid, toks(40, i))
            assert back.n_tokens == 40
            for layer, (k, v_) in zip(back.cache.layers, kv_of(40, i), strict=True):
                assert torch.equal(layer.keys, k) and torch.equal(layer.values, v_)


def test_a_full_disk_keeps_the_store_whole_and_it_comes_back(small_disk):
    root = small_disk.root / "kv"
    fill_store(root)
    before = listing(root)
    small_disk.fill()
    for _ in range(2):  # every start while the disk is full: refused, nothing touched
        with pytest.raises(StoreUnavailable, match="full"):
            open_store(root)
        assert listing(root) == before
        assert not [n for n in os.listdir(root) if ".corrupt-" in n]
    small_disk.free()
    assert_whole(root)


def test_disk_full_from_sqlite_is_not_corruption(tmp_path, monkeypatch):
    # the same decision when SQLite reports SQLITE_FULL (as it does on other filesystems)
    root = tmp_path / "kv"
    fill_store(root)
    before = listing(root)

    def full(path):
        err = sqlite3.OperationalError("database or disk is full")
        err.sqlite_errorcode = sqlite3.SQLITE_FULL
        raise err

    monkeypatch.setattr(sweep_module, "Manifest", full)
    with pytest.raises(StoreUnavailable):
        open_store(root)
    monkeypatch.undo()
    assert listing(root) == before
    assert_whole(root)


def test_only_one_damaged_manifest_is_kept(tmp_path):
    root = tmp_path / "kv"
    for _ in range(3):
        fill_store(root)
        with open(root / "manifest.sqlite", "r+b") as f:
            f.write(b"this is not a database at all....")
        with open_store(root) as s:
            assert s.sweep_report["manifest_reset"] and s.sessions() == []
    copies = [
        n
        for n in os.listdir(root)
        if n.startswith("manifest.sqlite.corrupt-") and n.count("-wal") == 0 and not n.endswith("-shm")
    ]
    assert len(copies) == 1, copies
