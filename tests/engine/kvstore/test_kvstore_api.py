"""SSD KV block store: job control, mixed sources, raw-bit fidelity, manifest recovery, CUDA."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import DynamicCache

from engine.kvstore import KVStore, KVStoreError
from engine.kvstore.layout import build_cache
from engine.pictures.span import PictureKey, PictureSpan

NS = b"api-model"


def kv_of(n, layers=2, heads=2, dim=16, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(1, heads, n, dim, generator=g).to(dtype), torch.randn(1, heads, n, dim, generator=g).to(dtype))
        for _ in range(layers)
    ]


def toks(n, seed=0):
    return torch.randint(0, 50_000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def files_under(root):
    return sorted(f for _, _, fs in os.walk(os.path.join(root, "blobs")) for f in fs)


@pytest.fixture
def store(tmp_path):
    s = KVStore(str(tmp_path / "kv"), NS, block_tokens=16, unit_bytes=4096, min_free_bytes=0)
    yield s
    s.close()


def test_bf16_bit_patterns_survive_exactly(store):
    # random bits: NaNs, infinities, subnormals, negative zero; the store moves bytes, never values
    kv = []
    for _ in range(2):
        k = torch.empty(1, 2, 40, 16, dtype=torch.bfloat16)
        v = torch.empty(1, 2, 40, 16, dtype=torch.bfloat16)
        k.view(torch.int16).random_(-(2**15), 2**15)
        v.view(torch.int16).random_(-(2**15), 2**15)
        kv.append((k, v))
    t = toks(40)
    assert store.spill("a", t, [], build_cache(kv)).ok
    out = store.restore("a", t)
    for layer, (k, v) in zip(out.cache.layers, kv, strict=True):
        assert torch.equal(layer.keys.view(torch.int16), k.view(torch.int16))
        assert torch.equal(layer.values.view(torch.int16), v.view(torch.int16))


def test_restore_mixes_own_and_shared_blocks(store):
    kv, t = kv_of(96), toks(96)
    assert store.spill("long", t, [], build_cache(kv)).ok
    short = build_cache([(k[:, :, :48], v[:, :, :48]) for k, v in kv])
    assert store.spill("short", t[:48], [], short, {"turns": 1}).ok
    out = store.restore("short", t)
    assert out.n_tokens == 96 and out.stats.source == "session+shared"
    assert out.state == {"turns": 1} and not out.stats.state_complete
    assert all(torch.equal(layer.keys, k) for layer, (k, _) in zip(out.cache.layers, kv, strict=True))
    assert store.restore("short", t, shared=False).n_tokens == 48


def test_cancel_and_drop_leave_nothing_behind(store, tmp_path):
    kv, t = kv_of(200, layers=4), toks(200)
    job = store.begin_spill("a", t, [], build_cache(kv))
    assert not job.step()  # one unit handed over, more to go
    job.cancel()
    res = job.result()
    assert not res.ok and res.error == "cancelled"
    assert store.sessions() == [] and files_under(store.root) == []
    # dropped while its writes are queued: the row must not come back
    job = store.begin_spill("b", t, [], build_cache(kv))
    job.run_copies()
    store.drop_session("b")
    res = job.result()
    assert res.ok or "dropped" in res.error  # ok only if it committed before the drop
    assert store.sessions() == [] and files_under(store.root) == []
    assert store.counters["spill_failures"] == 2 - res.ok


def test_sweep_refused_while_spilling_and_ready_flag(store):
    kv, t = kv_of(200, layers=4), toks(200)
    job = store.begin_spill("a", t, [], build_cache(kv))
    with pytest.raises(KVStoreError):
        store.sweep()
    while not job.ready():
        pass
    # ready() promises a step that does not refuse: it copies one unit (of many: 200 tokens do
    # not fit one 4 KiB unit), so copy time is spent and more remains
    spent = job.stats.copy_seconds
    assert job.step(block=False) is False
    assert job.stats.copy_seconds > spent and not job.copies_done
    job.run_copies()
    assert job.result().ok
    assert store.sweep()["orphans_removed"] == 0


def test_known_blob_and_session_edit_releases_old_blobs(store):
    kv, t = kv_of(64), toks(64)
    assert store.spill("a", t, [], build_cache(kv)).ok
    keys = store.session_info("a")["block_keys"]
    assert all(store.known_blob(k) for k in keys)
    # the conversation was edited: same id, different content from token 20 on
    kv2, t2 = kv_of(40, seed=3), t[:20] + toks(20, seed=3)
    r = store.spill("a", t2, [], build_cache(kv2))
    assert r.ok and r.reused_blobs == 1  # only block 0 is shared with the old content
    assert store.known_blob(keys[0]) and not any(store.known_blob(k) for k in keys[1:])
    assert store.counters["blobs_on_disk"] == 3  # 2 blocks + tail
    assert len(files_under(store.root)) == 3


def test_corrupt_manifest_is_set_aside(tmp_path):
    root = str(tmp_path / "kv")
    kv, t = kv_of(40), toks(40)
    with KVStore(root, NS, block_tokens=16, min_free_bytes=0) as s:
        assert s.spill("a", t, [], build_cache(kv)).ok
    with open(os.path.join(root, "manifest.sqlite"), "r+b") as f:
        f.write(b"this is not a database at all....")
    with KVStore(root, NS, block_tokens=16, min_free_bytes=0) as s:
        assert s.sweep_report["manifest_reset"] and s.sweep_report["orphans_removed"] == 3
        assert s.sessions() == [] and files_under(root) == []
        assert s.spill("a", t, [], build_cache(kv)).ok
        assert s.restore("a", t).n_tokens == 40
    assert any(n.startswith("manifest.sqlite.corrupt-") for n in os.listdir(root))


def test_refuses_cache_without_layers_and_bad_arguments(store):
    with pytest.raises(Exception, match="not a transformers Cache"):
        store.begin_spill("a", [1, 2], [], object())
    kv = kv_of(10)
    with pytest.raises(ValueError):
        store.begin_spill("a", list(range(11)), [], build_cache(kv))  # more ids than cached tokens
    with pytest.raises(ValueError):
        store.begin_spill("a", list(range(10)), [PictureSpan(5, 12, PictureKey(b"p"))], build_cache(kv))
    with pytest.raises(TypeError):
        store.begin_spill("a", list(range(10)), [], build_cache(kv), {"x": object()})
    assert store.sessions() == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_round_trip(tmp_path):
    kv = [(k.cuda(), v.cuda()) for k, v in kv_of(300, layers=3, heads=4, dim=64, dtype=torch.bfloat16)]
    t = toks(300)
    with KVStore(str(tmp_path / "kv"), NS, block_tokens=64, unit_bytes=64 << 10, min_free_bytes=0) as s:
        assert s.spill("a", t, [], DynamicCache(ddp_cache_data=kv)).ok
        out = s.restore("a", t, device="cuda")
        assert out.n_tokens == 300
        for layer, (k, v) in zip(out.cache.layers, kv, strict=True):
            assert layer.keys.is_cuda and torch.equal(layer.keys, k) and torch.equal(layer.values, v)
        half = s.restore("a", t[:150] + [1] * 10, device="cuda")
        assert half.n_tokens == 150 and torch.equal(half.cache.layers[1].values, kv[1][1][:, :, :150])


def test_units_smaller_than_one_head_split_rows(tmp_path):
    # 256 tokens x 16 dims x 4 bytes = 16 KiB per head > a 4 KiB unit: pieces are row ranges
    kv, t = kv_of(300, layers=2, heads=2, dim=16, dtype=torch.float32), toks(300)
    with KVStore(str(tmp_path / "kv"), NS, unit_bytes=4096, min_free_bytes=0) as s:
        job = s.begin_spill("a", t, [], build_cache(kv))
        steps = 1
        while not job.step():
            steps += 1
        assert job.result().ok and steps >= 300 * 2 * 2 * 2 * 16 * 4 // 4096
        assert s.counters["host_buffer_bytes"] <= 2 * 4096
        out = s.restore("a", t)
        assert all(
            torch.equal(layer.keys, k) and torch.equal(layer.values, v)
            for layer, (k, v) in zip(out.cache.layers, kv, strict=True)
        )
