"""SSD KV block store: round trips, incremental spill, sharing, refusals and caps."""

from __future__ import annotations

import gc
import os
import weakref

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicSlidingWindowLayer

from engine.kvstore import KVStore, UnsupportedCache
from engine.kvstore.blob import blob_path
from engine.pictures.span import PictureKey, PictureSpan
from tests.helpers.kv_helpers import (  # noqa: F401 (store: the fixture)
    NS,
    assert_prefix,
    blob_files,
    cache_of,
    grow,
    make_kv,
    store,
    tokens,
)

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
    assert_prefix(store.restore("a", toks + [1, 2, 3]), kv, n)  # prompt extends
    assert_prefix(store.restore("a", toks, max_tokens=n - 1), kv, n - 1)  # leave one to prefill
    div = toks[:40] + [7] * 60  # diverges inside block 2: that block is read and used up to the difference
    out = store.restore("a", div)
    assert_prefix(out, kv, 40)
    assert out.stats.blobs_read == 3
    assert_prefix(store.restore("a", toks[:32] + [7] * 68), kv, 32)  # at a block's first token: nothing of it
    div_tail = toks[:98] + [toks[98] + 1, 5]  # diverges inside the tail
    assert_prefix(store.restore("a", div_tail), kv, 98)
    assert store.restore("a", [9] * 100).n_tokens == 0
    assert store.restore("nobody", tokens(10, seed=5)).cache is None


def test_pictures_are_part_of_the_key(store):
    n = 64
    kv, toks = make_kv(n), tokens(n)
    pics = [PictureSpan(20, 30, PictureKey(b"picture-A"))]
    assert store.spill("a", toks, pics, cache_of(kv)).ok
    assert_prefix(store.restore("a", toks, pics), kv, n)
    # same token ids, another picture: only the tokens before the picture are valid
    out = store.restore("a", toks, [PictureSpan(20, 30, PictureKey(b"picture-B"))])
    assert_prefix(out, kv, 20)
    # a restore never ends inside a picture
    assert_prefix(store.restore("a", toks, pics, max_tokens=25), kv, 20)


def test_a_re_sent_reply_that_differs_mid_block_restores_up_to_the_difference(store):
    """A client re-sends the conversation with its own text of the last reply (or the chat template
    writes it back differently): the prompt leaves the stored one inside a full block, not the tail.
    Seen in the day of chats (issue 44): 509 of 541 stored tokens agreed and only 256 were restored."""
    n = 90  # 5 blocks of 16 + tail 10; the reply generated was tokens 70..89
    kv, toks = make_kv(n), tokens(n)
    pics = [PictureSpan(20, 30, PictureKey(b"P")), PictureSpan(66, 69, PictureKey(b"Q"))]
    assert store.spill("a", toks, pics, cache_of(kv)).ok
    resent = toks[:70] + [t + 1 for t in toks[70:]] + [3, 4]  # another text of the reply, then a question
    assert_prefix(store.restore("a", resent, pics), kv, 70)
    # a picture that differs inside the compared block ends the prefix at that picture
    assert_prefix(store.restore("a", resent, [pics[0], PictureSpan(66, 69, PictureKey(b"R"))]), kv, 66)


def test_picture_difference_inside_the_tail(store):
    n = 40  # 2 blocks + tail of 8 (positions 32..39)
    kv, toks = make_kv(n), tokens(n)
    assert store.spill("a", toks, [PictureSpan(34, 37, PictureKey(b"P"))], cache_of(kv)).ok
    assert_prefix(store.restore("a", toks, [PictureSpan(34, 37, PictureKey(b"Q"))]), kv, 34)
    assert_prefix(store.restore("a", toks, [PictureSpan(34, 37, PictureKey(b"P"))]), kv, 40)


# ---------------------------------------------------------------------- incremental spill


def test_incremental_spill_writes_only_new_blocks(tmp_path):
    root = str(tmp_path / "inc")
    B = 16
    kv1, toks = make_kv(100), tokens(300)
    with KVStore(root, NS, block_tokens=B, unit_bytes=4096, min_free_bytes=0) as s:
        r1 = s.spill("c", toks[:100], [], cache_of(kv1))  # turn 1: 6 blocks + tail 4
        assert (r1.blocks_written, r1.tail_written) == (6, 1)
        kv2 = grow(kv1, 37, seed=2)  # turn 2: +37 -> 137
        r2 = s.spill("c", toks[:137], [], cache_of(kv2))
        assert r2.ok and r2.reused_blobs == 6 and r2.missing_blobs == 0
        assert r2.blocks_written == 137 // B - 100 // B == 2 and r2.tail_written == 1
        kv3 = grow(kv2, 50, seed=3)  # turn 3: +50 -> 187
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
    kv = make_kv(256, layers=4, kv_heads=4, head_dim=32)  # 4*2*4*256*32*4 = 1 MiB
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
        assert steps == 16  # 16 units of 64 KiB
        assert job.copies_done and job.step() is True
        expected = [(k.clone(), v.clone()) for k, v in kv]
        del cache, kv
        gc.collect()
        assert all(r() is None for r in refs)  # the job let go of the cache
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
    assert store.spill("a", toks_a, [], cache_of(kv_a)).ok  # 5 blocks
    # b opens with the same 50 tokens (3 full blocks), then differs
    kv_b = [
        (torch.cat([k[:, :, :50], nk], 2), torch.cat([v[:, :, :50], nv], 2))
        for (k, v), (nk, nv) in zip(kv_a, make_kv(30, seed=2), strict=True)
    ]
    toks_b = toks_a[:50] + tokens(30, seed=2)
    # a new conversation with the same opening restores the shared blocks from a's blobs
    pre = store.restore("b", toks_b)
    assert_prefix(pre, kv_b, 48)
    assert pre.stats.source == "shared" and pre.state == {}
    rb = store.spill("b", toks_b, [], cache_of(kv_b))
    assert rb.reused_blobs == 3 and rb.blocks_written == 2
    assert store.counters["blobs_on_disk"] == 5 + 2  # 80 tokens: no tails
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
        assert s.restore("a", toks["a"]).n_tokens == 48  # a is now the most recently used
        r = s.spill("d", toks["d"], [], cache_of(kvs["d"]))
        assert r.ok and r.evicted_sessions == 1
        assert sorted(s.sessions()) == ["a", "c", "d"]  # b was least recently used
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


def test_the_store_is_private_in_an_open_data_folder(tmp_path):
    """A data folder the user chose (left 0755 as it is) still gets a private KV store: the
    folders 0700, the manifest and its WAL files, the lock and the blobs 0600."""
    import stat

    def mode(p):
        return stat.S_IMODE(os.stat(p).st_mode)

    old = os.umask(0o022)
    try:
        data = tmp_path / "data"
        data.mkdir(mode=0o755)
        root = data / "kv-store"
        root.mkdir()  # as the spill scheduler made it under this umask
        kv = make_kv(300, layers=2, kv_heads=2, head_dim=8, dtype=torch.float32)
        with KVStore(str(root), NS, min_free_bytes=0) as s:
            assert s.spill("c", tokens(300), [], cache_of(kv), {}).ok
            folders = [root, root / "blobs", *[p for p in (root / "blobs").iterdir()]]
            files = [p for p in root.rglob("*") if p.is_file()]
            assert {p.name for p in files} >= {"manifest.sqlite", "manifest.sqlite-wal", "manifest.sqlite-shm"}
            assert [p for p in folders if mode(p) != 0o700] == []
            assert [p for p in files if mode(p) != 0o600] == []
            assert mode(data) == 0o755  # the user's own folder is left as it is
    finally:
        os.umask(old)


def _room_for_one_and_a_half(tmp_path) -> tuple[dict, dict, int]:
    """Sessions b and c of 48 tokens (their ids and KV), and a store cap that holds one, not both."""
    toks = {s: tokens(48, seed=i) for i, s in enumerate("bc")}
    kvs = {s: make_kv(48, seed=i) for i, s in enumerate("bc")}
    with KVStore(str(tmp_path / "probe"), NS, block_tokens=16, min_free_bytes=0) as p:
        one = p.spill("x", toks["b"], [], cache_of(kvs["b"])).bytes_written
    return toks, kvs, one * 3 // 2


def test_a_spill_that_fails_lets_the_store_evict_what_it_held_back(tmp_path):
    """A session with a spill in flight is never evicted, so another spill that completes
    meanwhile may leave the store over its cap until the first one ends. When that first one
    fails (a full disk, a cancel), the store must still come back under the cap. (A CI soak run
    found a store 10% over its quota for seven steps; this and the test below are the two ways
    reading the index showed.)"""
    toks, kvs, cap = _room_for_one_and_a_half(tmp_path)
    with KVStore(str(tmp_path / "kv"), NS, block_tokens=16, min_free_bytes=0, max_bytes=cap) as s:
        assert s.spill("b", toks["b"], [], cache_of(kvs["b"])).ok
        longer = tokens(64, seed=0)
        again = s.begin_spill("b", longer, [], cache_of(make_kv(64, seed=0)))  # in flight: b is protected
        r = s.spill("c", toks["c"], [], cache_of(kvs["c"]))
        assert r.ok and r.evicted_sessions == 0  # b's row could not go while its spill ran
        again.cancel()
        assert not again.result().ok
        assert s.counters["bytes_on_disk"] <= s.max_bytes
        assert s.sessions() == ["c"]  # b, least recently used, went once its spill had ended
        assert_prefix(s.restore("c", toks["c"]), kvs["c"], 48)
        assert not s.verify()["refcount_errors"]


def test_blobs_read_while_their_session_was_evicted_go_when_the_read_ends(tmp_path):
    """Eviction never deletes a blob a restore is reading; once that restore ends, the blobs no
    session names any more are deleted then, so the store is back within its cap."""
    toks, kvs, cap = _room_for_one_and_a_half(tmp_path)
    with KVStore(str(tmp_path / "kv"), NS, block_tokens=16, min_free_bytes=0, max_bytes=cap) as s:
        assert s.spill("b", toks["b"], [], cache_of(kvs["b"])).ok
        reading = s.begin_session_restore("b")  # resume-ahead reads b's blobs
        assert reading is not None and not reading.step()
        r = s.spill("c", toks["c"], [], cache_of(kvs["c"]))
        assert r.ok and r.evicted_sessions == 1 and s.sessions() == ["c"]
        reading.run()
        assert s.counters["bytes_on_disk"] <= s.max_bytes
        stored = sorted(name.split(".")[0] for name in blob_files(tmp_path / "kv"))
        assert stored == sorted(map(bytes.hex, s.index.session("c").keys()))
        assert not s.verify()["refcount_errors"]


def test_blobs_held_by_a_read_do_not_make_the_cap_evict_another_session(tmp_path):
    """A session evicted while resume-ahead reads it keeps its blobs until the read ends; those
    bytes are already on their way out, so eviction stops once the rest is within the cap rather
    than taking the next least recently used session as well."""
    toks = {s: tokens(48, seed=i) for i, s in enumerate("abc")}
    kvs = {s: make_kv(48, seed=i) for i, s in enumerate("abc")}
    with KVStore(str(tmp_path / "probe"), NS, block_tokens=16, min_free_bytes=0) as p:
        one = p.spill("x", toks["a"], [], cache_of(kvs["a"])).bytes_written
    with KVStore(str(tmp_path / "kv"), NS, block_tokens=16, min_free_bytes=0, max_bytes=one * 5 // 2) as s:
        for sid in "ab":
            assert s.spill(sid, toks[sid], [], cache_of(kvs[sid])).ok
        reading = s.begin_session_restore("a")  # a, least recently used, read back ahead
        assert reading is not None and not reading.step()
        r = s.spill("c", toks["c"], [], cache_of(kvs["c"]))
        assert r.ok and r.evicted_sessions == 1 and sorted(s.sessions()) == ["b", "c"]
        held = s.counters
        assert held["held_bytes"] == one and held["bytes_on_disk"] - held["held_bytes"] <= s.max_bytes
        reading.run()
        assert s.counters["held_bytes"] == 0 and s.counters["bytes_on_disk"] == 2 * one
        assert_prefix(s.restore("b", toks["b"]), kvs["b"], 48)
        assert not s.verify()["refcount_errors"]
