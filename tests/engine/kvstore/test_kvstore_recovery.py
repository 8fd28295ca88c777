"""SSD KV block store recovering: damaged blobs are detected and only the valid prefix is
restored; a restart finds what was committed and sweeps temp files and orphans."""

from __future__ import annotations

import os

import pytest
import torch

from engine.kvstore import KVStore, KVStoreError
from engine.kvstore.blob import blob_path
from engine.pictures.span import PictureKey, PictureSpan
from tests.helpers.kv_helpers import NS, assert_prefix, cache_of, grow, make_kv, store, tokens  # noqa: F401 (fixture)

# ---------------------------------------------------------------------- corruption


def _spilled(store, n=80):
    kv, toks = make_kv(n), tokens(n)
    assert store.spill("a", toks, [], cache_of(kv)).ok
    return kv, toks, store.session_info("a")


@pytest.mark.parametrize("damage", ["flip_payload", "flip_header", "truncate", "delete", "swap"])
def test_bad_blob_detected_and_only_valid_prefix_restored(store, damage):
    kv, toks, info = _spilled(store)
    path = blob_path(store.blobs_dir, info["block_keys"][2])
    if damage == "flip_payload":
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) - 10)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0x01]))
    elif damage == "flip_header":
        with open(path, "r+b") as f:
            f.seek(200)  # inside the token ids
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0x80]))
    elif damage == "truncate":
        os.truncate(path, os.path.getsize(path) - 1)
    elif damage == "delete":
        os.unlink(path)
    elif damage == "swap":  # a well-formed blob under the wrong name
        with open(blob_path(store.blobs_dir, info["block_keys"][3]), "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(data)
    out = store.restore("a", toks)
    assert_prefix(out, kv, 32)
    c = store.counters
    if damage == "delete":
        assert c["missing_blobs"] == 1 and c["bad_blobs"] == 0
    else:
        assert c["bad_blobs"] == 1 and c["missing_blobs"] == 0
        assert not os.path.exists(path)  # discarded, never served again
    # the next spill of the same conversation rewrites it and says so
    r = store.spill("a", toks, [], cache_of(kv))
    assert r.ok and r.missing_blobs == 1 and r.blocks_written == 1 and r.reused_blobs == 4
    assert_prefix(store.restore("a", toks), kv, 80)


def test_bad_tail_restores_the_blocks(store):
    kv, toks, info = _spilled(store, n=90)
    path = blob_path(store.blobs_dir, info["tail_key"])
    with open(path, "r+b") as f:
        f.seek(-1, 2)
        b = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([b[0] ^ 0x10]))
    out = store.restore("a", toks)
    assert_prefix(out, kv, 80)
    assert store.counters["bad_blobs"] == 1


def test_blob_deleted_between_spills_is_rewritten(store):
    kv, toks, info = _spilled(store, n=64)
    os.unlink(blob_path(store.blobs_dir, info["block_keys"][1]))
    kv2 = grow(kv, 20, seed=4)
    r = store.spill("a", tokens(64) + [5] * 20, [], cache_of(kv2))
    assert r.ok and r.missing_blobs == 1
    assert r.blocks_written == 1 + 1 and r.reused_blobs == 3  # the lost one + the new full block
    assert store.counters["missing_blobs"] == 1
    assert_prefix(store.restore("a", tokens(64) + [5] * 20), kv2, 84)
    assert not store.verify()["missing"]


# ---------------------------------------------------------------------- restart


def test_persistence_across_restart(tmp_path):
    root = str(tmp_path / "kv")
    kv, toks = make_kv(100, dtype=torch.bfloat16), tokens(100)
    s = KVStore(root, NS, block_tokens=16, min_free_bytes=0)
    assert s.spill(
        "a",
        toks[:70],
        [PictureSpan(3, 9, PictureKey(b"img"))],
        cache_of([(k[:, :, :70], v[:, :, :70]) for k, v in kv]),
        {"rope_deltas": torch.tensor([[2]]), "note": "x"},
    ).ok
    with pytest.raises(KVStoreError, match="in use by another process"):
        KVStore(root, NS)  # one process at a time
    s.close()
    s = KVStore(root, NS, block_tokens=16, min_free_bytes=0)
    assert s.sweep_report["orphans_removed"] == 0
    out = s.restore("a", toks[:70], [PictureSpan(3, 9, PictureKey(b"img"))])
    assert_prefix(out, kv, 70)
    assert out.state["note"] == "x" and torch.equal(out.state["rope_deltas"], torch.tensor([[2]]))
    # the memo survived: the follow-up spill after the restart writes only the new blocks
    r = s.spill("a", toks, [PictureSpan(3, 9, PictureKey(b"img"))], cache_of(kv))
    assert r.reused_blobs == 4 and r.blocks_written == 6 - 4 and r.tail_written == 1
    s.close()


def test_startup_sweep_removes_temp_and_orphans_without_reading(tmp_path):
    root = str(tmp_path / "kv")
    kv, toks = make_kv(40), tokens(40)
    with KVStore(root, NS, block_tokens=16, min_free_bytes=0) as s:
        assert s.spill("a", toks, [], cache_of(kv)).ok
        keep = blob_path(s.blobs_dir, s.session_info("a")["block_keys"][0])
    d = os.path.dirname(keep)
    tmp = os.path.join(d, "ab" * 32 + ".kvb.123.deadbeef.tmp")
    orphan = os.path.join(os.path.dirname(d), "ff", "ff" * 32 + ".kvb")
    for p in (tmp, orphan):
        with open(p, "wb") as f:
            f.write(b"junk")
    with KVStore(root, NS, block_tokens=16, min_free_bytes=0) as s:
        rep = s.sweep_report
        assert rep["tmp_removed"] == 1 and rep["orphans_removed"] == 1
        assert not os.path.exists(tmp) and not os.path.exists(orphan) and os.path.exists(keep)
        assert_prefix(s.restore("a", toks), kv, 40)


def test_sweep_handles_rows_whose_file_is_gone(tmp_path):
    root = str(tmp_path / "kv")
    kv, toks = make_kv(60), tokens(60)
    with KVStore(root, NS, block_tokens=16, min_free_bytes=0) as s:
        assert s.spill("a", toks, [], cache_of(kv)).ok
        info = s.session_info("a")
    os.unlink(blob_path(os.path.join(root, "blobs"), info["block_keys"][1]))
    os.truncate(blob_path(os.path.join(root, "blobs"), info["block_keys"][2]), 100)
    with KVStore(root, NS, block_tokens=16, min_free_bytes=0) as s:
        assert s.sweep_report["missing_rows"] == 1 and s.sweep_report["size_mismatch_removed"] == 1
        assert_prefix(s.restore("a", toks), kv, 16)
        r = s.spill("a", toks, [], cache_of(kv))
        assert r.missing_blobs == 2 and r.blocks_written == 2
        assert_prefix(s.restore("a", toks), kv, 60)
        v = s.verify()
        assert not v["missing"] and not v["bad"] and not v["refcount_errors"]
