"""Version rows in the KV store (#41): which of a conversation's rows holds the most of a prompt
(from keys alone), a restore that reads only past an opening the caller holds, and a row kept as
a version without a blob written."""

from __future__ import annotations

import torch

from engine.kvstore import best_of, is_version
from engine.kvstore.layout import build_cache
from engine.kvstore.versions import conversation_of
from tests.helpers.kv_helpers import make_kv, store, tokens  # noqa: F401 (store: a fixture)

B = 16


def two_versions(store):  # noqa: F811 (the fixture)
    """A chat's row (version 1: 60 tokens) and a version row (version 2: the same 20-token
    opening, then 50 of its own), as the engine leaves them."""
    opening = tokens(20, seed=1)
    one, two = opening + tokens(40, seed=2), opening + tokens(50, seed=3)
    kv_one, kv_two = make_kv(60, seed=1), make_kv(70, seed=2)
    for kv in (kv_one, kv_two):  # KV is causal: the same opening has the same K/V
        for (k, v), (k0, v0) in zip(kv, kv_one, strict=True):
            k[:, :, :20], v[:, :, :20] = k0[:, :, :20], v0[:, :, :20]
    assert store.spill("chat", one, [], build_cache(kv_one)).ok
    vid = store.version_id("chat", two)
    assert store.spill(vid, two, [], build_cache(kv_two)).ok
    return one, two, kv_one, kv_two, vid


def test_the_version_holding_most_of_a_prompt_is_found_from_keys(store):  # noqa: F811
    one, two, _, _, vid = two_versions(store)
    assert is_version(vid) and conversation_of(vid) == "chat" and not is_version("chat")
    assert store.version_id("chat", two) == vid  # the same content, the same name
    follow_two = two + tokens(9, seed=4)
    matches = store.row_matches("chat", follow_two)
    assert [m.id for m in matches] == ["chat", vid]  # the chat's own row first
    best = best_of(matches)
    assert best is not None and best.id == vid and best.n_tokens == 70  # blocks and the whole tail
    own = matches[0]
    assert own.n_tokens == 16 and own.up_to == 16  # one whole block of the shared opening
    # a prompt whose tail differs in part: the row may hold more, known once the tail is read
    changed = two[:66] + [7, 7, 7, 7, 7]
    m = best_of(store.row_matches("chat", changed))
    assert m is not None and m.id == vid and m.n_tokens == 64 and m.up_to == 70
    assert store.row_matches("other", follow_two) == []


def test_a_restore_reads_only_past_the_opening_held(store):  # noqa: F811
    _, two, _, kv_two, vid = two_versions(store)
    prompt = two + tokens(5, seed=5)
    res = store.restore(vid, prompt, skip_tokens=37, max_tokens=len(prompt) - 1)
    assert res.start == 32 and res.n_tokens == 70  # whole blocks after the opening held
    assert res.stats.blobs_read == 3  # blocks 2 and 3 and the tail, not blocks 0 and 1
    for layer, (k, v) in zip(res.cache.layers, kv_two, strict=True):
        assert torch.equal(layer.keys, k[:, :, 32:70]) and torch.equal(layer.values, v[:, :, 32:70])
    # a restore starts at a block's start, never inside one: past the whole row, its tail
    res = store.restore(vid, prompt, skip_tokens=80)
    assert (res.start, res.n_tokens, res.stats.blobs_read) == (64, 70, 1)


def test_a_row_kept_as_a_version_writes_nothing_and_outlives_its_chat_row(store):  # noqa: F811
    one, two, kv_one, _, _ = two_versions(store)
    written = store.counters["blocks_written"] + store.counters["tails_written"]
    vid = store.keep_as_version("chat")
    assert vid == store.version_id("chat", one)
    assert store.counters["blocks_written"] + store.counters["tails_written"] == written
    # the chat's next spill replaces its row: the version's blobs stay
    assert store.spill("chat", two[:40], [], build_cache(make_kv(40, seed=9))).ok
    res = store.restore(vid, one + [1])
    assert res.n_tokens == 60
    for layer, (k, v) in zip(res.cache.layers, kv_one, strict=True):
        assert torch.equal(layer.keys, k) and torch.equal(layer.values, v)
    assert store.keep_as_version("no such chat") is None
