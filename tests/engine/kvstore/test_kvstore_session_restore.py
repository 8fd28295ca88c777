"""Restoring a session's own stored KV without its prompt (what opening a chat does): a blob per
step, each block checked against its chained key from the tokens in its own header, so a blob
whose tokens were changed under a valid checksum is caught, counted and never served."""

from __future__ import annotations

import os

import numpy as np
import torch

from engine.kvstore import KVStore, PictureSpan
from engine.kvstore.blob import KIND_BLOCK, encode_header, parse_header
from engine.kvstore.keys import block_keys
from engine.kvstore.session_restore import kv_bytes
from engine.pictures.span import PictureKey
from tests.helpers.kv_helpers import NS, assert_prefix, cache_of, make_kv, store, tokens  # noqa: F401

PIC = PictureSpan(20, 36, PictureKey(b"p" * 32))


def spilled(store, n=53, sid="chat"):
    kv, ids = make_kv(n), tokens(n)
    result = store.spill(sid, ids, [PIC], cache_of(kv), {"rope_delta": 7})
    assert result.ok, result.error
    return kv, ids


def test_a_whole_session_comes_back_a_blob_per_step(store):
    kv, ids = spilled(store)  # 3 blocks of 16 and a 5-token tail
    listed = store.stored_sessions()
    assert [(s.id, s.n_tokens) for s in listed] == [("chat", 53)]
    assert (
        listed[0].memory_bytes()
        == kv_bytes(listed[0].layout, 53, None)
        == sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
    )
    job = store.begin_session_restore("chat")
    steps = 0
    while not job.step():
        steps += 1
        assert job.done_tokens == 16 * steps  # a turn could take the thread here
    assert steps + 1 == 4 and job.done_tokens == 53
    got = job.result()
    assert got.ids == ids and got.pictures == (PIC,) and got.complete and got.state == {"rope_delta": 7}
    assert got.bytes_read == job.nbytes > 0
    assert_prefix(got, kv, 53)
    assert store.counters["restores"] == 1 and store.counters["restored_tokens"] == 53


def test_a_block_whose_tokens_do_not_hash_to_its_key_ends_the_restore(store):
    kv, ids = spilled(store)
    key = block_keys(store._ns(None), np.asarray(ids, dtype=np.int64), [PIC], 16)[1]
    path = store.index.path(key)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    hdr = parse_header(data)
    forged = hdr.tokens.copy()
    forged[3] += 1  # different tokens, same key name, every checksum valid
    head = encode_header(KIND_BLOCK, hdr.layout, hdr.key, forged, hdr.payload_digest)
    with open(path, "wb") as f:
        f.write(head + bytes(data[hdr.header_len :]))
    assert parse_header(bytearray(head)).tokens[3] == forged[3]  # the forgery itself reads as a valid blob

    job = store.begin_session_restore("chat")
    job.run()
    got = job.result()
    assert got.ids == ids[:16] and not got.complete and got.state == {}
    assert_prefix(got, kv, 16)
    assert store.counters["bad_blobs"] == 1 and not os.path.exists(path)  # discarded, never served


def test_a_picture_cut_by_the_restore_is_kept_with_its_whole_span(store):
    kv, ids = spilled(store)
    key = block_keys(store._ns(None), np.asarray(ids, dtype=np.int64), [PIC], 16)[2]
    os.unlink(store.index.path(key))  # tokens 32.. are gone: the restore ends inside the picture (20..36)
    job = store.begin_session_restore("chat")
    job.run()
    got = job.result()
    assert len(got.ids) == 32 and got.pictures == (PIC,)  # its span says where the rest of it lies
    assert store.counters["missing_blobs"] == 1


def test_no_row_no_job_and_a_cancelled_job_lets_its_blobs_go(store, tmp_path):
    assert store.begin_session_restore("never") is None
    spilled(store)
    other = KVStore(str(tmp_path / "kv2"), NS + b"-other-model", block_tokens=16, min_free_bytes=0)
    try:
        assert other.begin_session_restore("chat") is None and other.stored_sessions() == []
    finally:
        other.close()
    job = store.begin_session_restore("chat")
    assert store.index._read_pins  # pinned while it runs
    job.step()
    job.cancel()
    assert not store.index._read_pins and job.result().cache is None
    assert store.drop_session("chat") and store.stored_sessions() == []


def test_restoring_to_another_dtype_casts_on_the_way_in(store):
    kv, ids = spilled(store)
    job = store.begin_session_restore("chat", dtype=torch.bfloat16)
    job.run()
    layer = job.result().cache.layers[0]
    assert layer.keys.dtype == torch.bfloat16 and torch.equal(layer.keys, kv[0][0].to(torch.bfloat16))
