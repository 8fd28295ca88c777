"""SSD KV block store: round trips, incremental spill, sharing, corruption, restart, caps."""
from __future__ import annotations

import gc
import os
import weakref

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from engine.kvstore import KVStore, UnsupportedCache
from engine.kvstore.blob import blob_path

NS = b"test-model:v1"


# ---------------------------------------------------------------------- helpers

def make_kv(n, layers=3, kv_heads=2, head_dim=16, dtype=torch.float32, seed=0, v_dim=None):
    g = torch.Generator().manual_seed(seed)
    v_dim = v_dim or head_dim
    return [(torch.randn(1, kv_heads, n, head_dim, generator=g).to(dtype),
             torch.randn(1, kv_heads, n, v_dim, generator=g).to(dtype)) for _ in range(layers)]


def grow(kv, extra, seed):
    """The same conversation k tokens later: old K/V unchanged, new ones appended."""
    new = make_kv(extra, len(kv), kv[0][0].shape[1], kv[0][0].shape[3], kv[0][0].dtype, seed,
                  kv[0][1].shape[3])
    return [(torch.cat([k, nk], 2), torch.cat([v, nv], 2)) for (k, v), (nk, nv) in zip(kv, new)]


def cache_of(kv):
    return DynamicCache(ddp_cache_data=kv)


def tokens(n, seed=0):
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randint(0, 150_000, (n,), generator=g).tolist()


def assert_prefix(result, kv, n):
    assert result.n_tokens == n
    if n == 0:
        assert result.cache is None
        return
    assert len(result.cache.layers) == len(kv)
    for layer, (k, v) in zip(result.cache.layers, kv):
        assert type(layer) is DynamicLayer
        assert torch.equal(layer.keys, k[:, :, :n]) and torch.equal(layer.values, v[:, :, :n])
    assert result.cache.get_seq_length() == n


def blob_files(root):
    out = {}
    for dirpath, _, names in os.walk(os.path.join(root, "blobs")):
        for name in names:
            with open(os.path.join(dirpath, name), "rb") as f:
                out[name] = f.read()
    return out


@pytest.fixture
def store(tmp_path):
    s = KVStore(str(tmp_path / "kv"), NS, block_tokens=16, unit_bytes=8192, min_free_bytes=0)
    yield s
    s.close()


# ---------------------------------------------------------------------- round trips

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_round_trip_exact_gqa(tmp_path, dtype):
    n = 700  # 2 full blocks of 256 + a tail of 188, default block size
    kv = make_kv(n, layers=4, kv_heads=2, head_dim=64, dtype=dtype)
    toks = tokens(n)
    with KVStore(str(tmp_path / "kv"), NS, min_free_bytes=0) as s:
        r = s.spill("conv", toks, [], cache_of(kv), {"rope_deltas": torch.tensor([[-7]])})
        assert r.ok, r.error
        assert (r.blocks_written, r.tail_written, r.reused_blobs) == (2, 1, 0)
        out = s.restore("conv", toks)
        assert_prefix(out, kv, n)
        assert out.cache.layers[0].keys.dtype == dtype
        assert torch.equal(out.state["rope_deltas"], torch.tensor([[-7]]))
        assert out.stats.state_complete and out.stats.source == "session"
        assert s.counters["restored_tokens"] == n
        # a cast on the way out is allowed too
        out32 = s.restore("conv", toks, dtype=torch.float32)
        assert torch.equal(out32.cache.layers[2].values, kv[2][1].float())


def test_round_trip_mixed_head_dims(store):
    kv = make_kv(50, layers=2, kv_heads=3, head_dim=8, v_dim=12, dtype=torch.bfloat16)
    toks = tokens(50)
    assert store.spill("a", toks, [], cache_of(kv)).ok
    assert_prefix(store.restore("a", toks), kv, 50)


def test_cache_longer_than_tokens_spills_only_the_given_tokens(store):
    kv = make_kv(40)
    toks = tokens(40)[:33]
    assert store.spill("a", toks, [], cache_of(kv)).ok
    assert_prefix(store.restore("a", toks), kv, 33)


def test_restore_prefix_when_prompt_extends_or_diverges(store):
    n = 100  # 6 blocks of 16 + tail 4
    kv, toks = make_kv(n), tokens(n)
    assert store.spill("a", toks, [], cache_of(kv)).ok
    assert_prefix(store.restore("a", toks + [1, 2, 3]), kv, n)          # prompt extends
    assert_prefix(store.restore("a", toks, max_tokens=n - 1), kv, n - 1)  # leave one to prefill
    div = toks[:40] + [7] * 60                                          # diverges inside block 2
    assert_prefix(store.restore("a", div), kv, 32)
    div_tail = toks[:98] + [toks[98] + 1, 5]                            # diverges inside the tail
    assert_prefix(store.restore("a", div_tail), kv, 98)
    assert store.restore("a", [9] * 100).n_tokens == 0
    assert store.restore("nobody", tokens(10, seed=5)).cache is None


def test_pictures_are_part_of_the_key(store):
    n = 64
    kv, toks = make_kv(n), tokens(n)
    pics = [(20, 30, b"picture-A")]
    assert store.spill("a", toks, pics, cache_of(kv)).ok
    assert_prefix(store.restore("a", toks, pics), kv, n)
    # same token ids, another picture: only the blocks before the picture are valid
    out = store.restore("a", toks, [(20, 30, b"picture-B")])
    assert_prefix(out, kv, 16)
    # a restore never ends inside a picture
    assert_prefix(store.restore("a", toks, pics, max_tokens=25), kv, 20)


def test_picture_difference_inside_the_tail(store):
    n = 40  # 2 blocks + tail of 8 (positions 32..39)
    kv, toks = make_kv(n), tokens(n)
    assert store.spill("a", toks, [(34, 37, b"P")], cache_of(kv)).ok
    assert_prefix(store.restore("a", toks, [(34, 37, b"Q")]), kv, 34)
    assert_prefix(store.restore("a", toks, [(34, 37, b"P")]), kv, 40)


# ---------------------------------------------------------------------- incremental spill

def test_incremental_spill_writes_only_new_blocks(tmp_path):
    root = str(tmp_path / "inc")
    B = 16
    kv1, toks = make_kv(100), tokens(300)
    with KVStore(root, NS, block_tokens=B, unit_bytes=4096, min_free_bytes=0) as s:
        r1 = s.spill("c", toks[:100], [], cache_of(kv1))          # turn 1: 6 blocks + tail 4
        assert (r1.blocks_written, r1.tail_written) == (6, 1)
        kv2 = grow(kv1, 37, seed=2)                                  # turn 2: +37 -> 137
        r2 = s.spill("c", toks[:137], [], cache_of(kv2))
        assert r2.ok and r2.reused_blobs == 6 and r2.missing_blobs == 0
        assert r2.blocks_written == 137 // B - 100 // B == 2 and r2.tail_written == 1
        kv3 = grow(kv2, 50, seed=3)                                  # turn 3: +50 -> 187
        r3 = s.spill("c", toks[:187], [], cache_of(kv3))
        assert r3.reused_blobs == 8 and r3.blocks_written == 187 // B - 137 // B == 3
        assert r3.blocks_written <= -(-50 // B) + 1
        assert r3.reused_bytes == 8 * os.path.getsize(blob_path(s.blobs_dir, s.session_info("c")["block_keys"][0]))
        # unchanged conversation: nothing written at all
        r4 = s.spill("c", toks[:187], [], cache_of(kv3))
        assert (r4.blocks_written, r4.tail_written, r4.bytes_written) == (0, 0, 0)
        assert_prefix(s.restore("c", toks[:187]), kv3, 187)
        c = s.counters
        assert c["spills"] == 4 and c["blocks_written"] == 11 and c["blobs_on_disk"] == 12  # old tails released
    # the incremental store holds exactly the bytes a from-scratch spill writes
    with KVStore(str(tmp_path / "full"), NS, block_tokens=B, min_free_bytes=0) as s2:
        assert s2.spill("c", toks[:187], [], cache_of(kv3)).blocks_written == 11
    assert blob_files(root) == blob_files(str(tmp_path / "full"))


def test_unit_copies_are_bounded_and_release_the_cache(tmp_path):
    kv = make_kv(256, layers=4, kv_heads=4, head_dim=32)           # 4*2*4*256*32*4 = 1 MiB
    toks = tokens(256)
    unit = 72 << 10  # a buffer is the unit less a small bookkeeping reserve: two 32 KiB tensors fit
    with KVStore(str(tmp_path / "kv"), NS, block_tokens=64, unit_bytes=unit, min_free_bytes=0) as s:
        cache = cache_of(kv)
        refs = [weakref.ref(layer.keys) for layer in cache.layers]
        job = s.begin_spill("a", toks, [], cache)
        steps = 1
        while not job.step():
            steps += 1
            assert s.counters["host_buffer_bytes"] <= 2 * unit
        assert steps == 16                                          # 16 units of 64 KiB
        assert job.copies_done and job.step() is True
        expected = [(k.clone(), v.clone()) for k, v in kv]
        del cache, kv
        gc.collect()
        assert all(r() is None for r in refs)                       # the job let go of the cache
        res = job.result()
        assert res.ok and res.blocks_written == 4
        assert_prefix(s.restore("a", toks), expected, 256)
        # non-blocking steps: never blocks, eventually done
        job2 = s.begin_spill("b", tokens(256, 1), [], cache_of(make_kv(256, 4, 4, 32, seed=9)))
        while not job2.step(block=False):
            pass
        assert job2.wait(timeout=30).ok


def test_session_sharing_an_opening_stores_shared_blocks_once(store):
    kv_a = make_kv(80, seed=1)
    toks_a = tokens(80, seed=1)
    assert store.spill("a", toks_a, [], cache_of(kv_a)).ok           # 5 blocks
    # b opens with the same 50 tokens (3 full blocks), then differs
    kv_b = [(torch.cat([k[:, :, :50], nk], 2), torch.cat([v[:, :, :50], nv], 2))
            for (k, v), (nk, nv) in zip(kv_a, make_kv(30, seed=2))]
    toks_b = toks_a[:50] + tokens(30, seed=2)
    # a new conversation with the same opening restores the shared blocks from a's blobs
    pre = store.restore("b", toks_b)
    assert_prefix(pre, kv_b, 48)
    assert pre.stats.source == "shared" and pre.state == {}
    rb = store.spill("b", toks_b, [], cache_of(kv_b))
    assert rb.reused_blobs == 3 and rb.blocks_written == 2
    assert store.counters["blobs_on_disk"] == 5 + 2                  # 80 tokens: no tails
    info_a, info_b = store.session_info("a"), store.session_info("b")
    assert info_a["block_keys"][:3] == info_b["block_keys"][:3]
    assert info_a["block_keys"][3] != info_b["block_keys"][3]
    rows = store.index.blob_rows()
    assert [rows[k][1] for k in info_a["block_keys"]] == [2, 2, 2, 1, 1]
    # dropping a keeps b whole
    assert store.drop_session("a")
    assert store.counters["blobs_on_disk"] == 5
    assert_prefix(store.restore("b", toks_b), kv_b, 80)


def test_other_namespace_never_matches(store):
    kv, toks = make_kv(40), tokens(40)
    assert store.spill("a", toks, [], cache_of(kv)).ok
    assert store.restore("a", toks, namespace=b"other-model").n_tokens == 0


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
    assert s.spill("a", toks[:70], [(3, 9, b"img")], cache_of([(k[:, :, :70], v[:, :, :70]) for k, v in kv]),
                   {"rope_deltas": torch.tensor([[2]]), "note": "x"}).ok
    with pytest.raises(Exception):
        KVStore(root, NS)  # one process at a time
    s.close()
    s = KVStore(root, NS, block_tokens=16, min_free_bytes=0)
    assert s.sweep_report["orphans_removed"] == 0
    out = s.restore("a", toks[:70], [(3, 9, b"img")])
    assert_prefix(out, kv, 70)
    assert out.state["note"] == "x" and torch.equal(out.state["rope_deltas"], torch.tensor([[2]]))
    # the memo survived: the follow-up spill after the restart writes only the new blocks
    r = s.spill("a", toks, [(3, 9, b"img")], cache_of(kv))
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


# ---------------------------------------------------------------------- refusals, caps

def test_sliding_window_layer_refused(store):
    k, v = torch.randn(1, 2, 20, 8), torch.randn(1, 2, 20, 8)
    cache = DynamicCache(ddp_cache_data=[(k, v), (k, v, torch.tensor(4096))])
    assert type(cache.layers[1]) is DynamicSlidingWindowLayer
    with pytest.raises(UnsupportedCache) as e:
        store.begin_spill("a", list(range(20)), [], cache)
    assert e.value.layer_index == 1 and e.value.layer_type == "DynamicSlidingWindowLayer"
    assert "DynamicSlidingWindowLayer" in str(e.value) and "sliding" in str(e.value)
    assert store.counters["blobs_on_disk"] == 0 and store.sessions() == []
    with pytest.raises(UnsupportedCache):
        store.begin_spill("a", list(range(2)), [], DynamicCache(ddp_cache_data=[(k.long(), v.long())]))


def test_cap_evicts_least_recently_used_session(tmp_path):
    toks = {s: tokens(48, seed=i) for i, s in enumerate("abcd")}
    kvs = {s: make_kv(48, seed=i) for i, s in enumerate("abcd")}
    with KVStore(str(tmp_path / "probe"), NS, block_tokens=16, min_free_bytes=0) as p:
        one = p.spill("x", toks["a"], [], cache_of(kvs["a"])).bytes_written
    with KVStore(str(tmp_path / "kv"), NS, block_tokens=16, min_free_bytes=0, max_bytes=3 * one + 100) as s:
        for sid in "abc":
            assert s.spill(sid, toks[sid], [], cache_of(kvs[sid])).ok
        assert s.restore("a", toks["a"]).n_tokens == 48       # a is now the most recently used
        r = s.spill("d", toks["d"], [], cache_of(kvs["d"]))
        assert r.ok and r.evicted_sessions == 1
        assert sorted(s.sessions()) == ["a", "c", "d"]          # b was least recently used
        assert s.counters["bytes_on_disk"] <= s.max_bytes
        assert s.counters["evicted_sessions"] == 1
        assert s.restore("b", toks["b"]).n_tokens == 0
        assert_prefix(s.restore("a", toks["a"]), kvs["a"], 48)
        assert not s.verify()["refcount_errors"]


def test_session_larger_than_cap_fails_cleanly(tmp_path):
    kv, toks = make_kv(64), tokens(64)
    with KVStore(str(tmp_path / "kv"), NS, block_tokens=16, min_free_bytes=0, max_bytes=10_000) as s:
        r = s.spill("a", toks, [], cache_of(kv))
        assert not r.ok and "cap" in r.error
        assert s.counters["blobs_on_disk"] == 0 and s.sessions() == []
        assert s.counters["spill_failures"] == 1
