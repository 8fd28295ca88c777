"""A language model on a CPU attends through engine/model/cpu_attention.py: a decoded token's and a
prompt-lookup draft's rows through two small products in fp32, a long masked prompt piece in
blocks of rows; a short prompt's rows still go through transformers' SDPA bit for bit; rows agree
with exact arithmetic and ignore masked keys; the language model is switched to it and the vision
tower is not; the KV namespace names it; and a bf16 engine's replies equal a fresh prefill's,
with KV reused and restored from the SSD (fp32's are checked by every other engine test)."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from engine.model import cpu_attention
from engine.model.load import load_model
from engine.protocol.events import Message
from tests.fixtures.pictures import make_picture, pics
from tests.fixtures.tiny_models import FAMILIES
from tests.helpers.engine_helpers import Reference, ask, expect_done, open_engine, spill_now

HEADS, KV_HEADS, DIM, LENGTH = 6, 2, 32, 40


class _Layer(torch.nn.Module):  # what transformers' attention functions read from the calling layer
    num_key_value_groups = HEADS // KV_HEADS
    is_causal = True


def _qkv(rows: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, rows, HEADS, DIM, generator=g).transpose(1, 2)  # as a model hands it over
    k = torch.randn(1, KV_HEADS, LENGTH, DIM, generator=g)
    v = torch.randn(1, KV_HEADS, LENGTH, DIM, generator=g)
    return q.bfloat16(), k.bfloat16(), v.bfloat16()


def test_a_prompts_rows_keep_transformers_sdpa_bit_for_bit():
    q, k, v = _qkv(rows=LENGTH)
    ours, _ = cpu_attention.attention(_Layer(), q, k, v, None, is_causal=True)
    theirs, _ = sdpa_attention_forward(_Layer(), q, k, v, None, is_causal=True)
    assert torch.equal(ours, theirs)


def _exact(q, k, v, seen):
    groups = HEADS // KV_HEADS
    kk, vv = k.double().repeat_interleave(groups, 1), v.double().repeat_interleave(groups, 1)
    scores = (q.double() @ kk.transpose(-1, -2)) / DIM**0.5
    return (scores.masked_fill(~seen, float("-inf")).softmax(-1) @ vv).transpose(1, 2)


def _close(ours, exact) -> bool:  # only the final rounding to bf16 (8 bits of mantissa) between them
    return bool(((ours.double() - exact).abs() <= exact.abs() * 2**-8 + 1e-6).all())


def test_one_row_agrees_with_exact_arithmetic_and_ignores_masked_keys():
    q, k, v = _qkv(rows=1, seed=1)
    seen = torch.ones(1, 1, 1, LENGTH, dtype=torch.bool)
    seen[..., :5] = False  # left padding
    ours, _ = cpu_attention.attention(_Layer(), q, k, v, seen)
    assert ours.shape == (1, 1, HEADS, DIM) and ours.dtype == torch.bfloat16
    assert _close(ours, _exact(q, k, v, seen))
    assert _close(cpu_attention.attention(_Layer(), q, k, v, None)[0], _exact(q, k, v, torch.ones_like(seen)))

    v2 = v.clone()
    v2[:, :, :5] = 100.0  # what a masked key holds must not reach the output
    assert torch.equal(cpu_attention.attention(_Layer(), q, k, v2, seen)[0], ours)


def test_a_drafts_rows_each_see_the_keys_up_to_their_own():
    rows = 11  # a decoded token and a 10-token prompt-lookup draft
    q, k, v = _qkv(rows=rows, seed=2)
    seen = torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril()[-rows:].view(1, 1, rows, LENGTH)
    ours, _ = cpu_attention.attention(_Layer(), q, k, v, seen)
    assert ours.shape == (1, rows, HEADS, DIM)
    assert _close(ours, _exact(q, k, v, seen))


def _near(ours, exact) -> bool:  # fp32 arithmetic, summed in another order than float64's
    return bool(((ours.double() - exact).abs() <= exact.abs() * 1e-5 + 1e-6).all())


def _causal(rows: int, length: int) -> torch.Tensor:
    """The mask of a prompt piece of `rows` after `length - rows` earlier tokens: True where seen."""
    return torch.ones(length, length, dtype=torch.bool).tril()[-rows:].view(1, 1, rows, length)


@pytest.mark.parametrize("block", [4, 7])
def test_a_long_piece_in_blocks_agrees_with_exact_arithmetic(block, monkeypatch):
    """Rows in blocks, each block given the keys up to its last row's: every row as exact
    arithmetic over the keys it may see, masked keys' values kept out."""
    monkeypatch.setattr(cpu_attention, "ROWS", 2)  # keep the few-row products out of the way
    monkeypatch.setattr(cpu_attention, "BLOCK", block)
    rows = 29
    q, k, v = (t.float() for t in _qkv(rows=rows, seed=3))  # fp32: SDPA's own rounding out of the way
    seen = _causal(rows, LENGTH)
    ours, _ = cpu_attention.attention(_Layer(), q, k, v, seen)
    assert ours.shape == (1, rows, HEADS, DIM)
    assert _near(ours, _exact(q, k, v, seen))
    v2 = v.clone()
    v2[:, :, -1] = 100.0  # the last key: seen by the last row only
    changed = (cpu_attention.attention(_Layer(), q, k, v2, seen)[0] != ours).any(-1).any(-1)[0]
    assert changed.tolist() == [False] * (rows - 1) + [True]


def test_a_block_whose_rows_see_ahead_gets_the_keys_they_see(monkeypatch):
    """A picture whose tokens attend both ways (Gemma 3): a row of the first block sees keys past
    that block's causal end, so the block is given them."""
    monkeypatch.setattr(cpu_attention, "ROWS", 2)
    monkeypatch.setattr(cpu_attention, "BLOCK", 8)
    rows = 24
    q, k, v = (t.float() for t in _qkv(rows=rows, seed=4))
    seen = _causal(rows, LENGTH).clone()
    first = LENGTH - rows
    seen[..., 5:12, first + 5 : first + 12] = True  # a picture at rows 5-11, across the first two blocks
    ours, _ = cpu_attention.attention(_Layer(), q, k, v, seen)
    assert _near(ours, _exact(q, k, v, seen))


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_a_cpu_model_attends_through_it_in_its_language_model_only(family, tiny_model, monkeypatch):
    model = tiny_model(family)
    for weights in ("bf16", "fp32"):
        loaded = load_model(model, device="cpu", weights=weights)
        assert loaded.model.config.get_text_config()._attn_implementation == cpu_attention.NAME
        vision = getattr(loaded.model.config, "vision_config", None)
        assert vision is not None and vision._attn_implementation == "sdpa"
    # KV written under another decode arithmetic is never restored: the namespace names it
    monkeypatch.setattr(cpu_attention, "LAYOUT", cpu_attention.LAYOUT + "-other")
    assert load_model(model, device="cpu", weights="fp32").fingerprint != loaded.fingerprint


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_replies_equal_a_fresh_prefill_with_kv_reused_and_restored(family, tiny_model, tmp_path, monkeypatch):
    model = tiny_model(family)
    monkeypatch.setattr(cpu_attention, "BLOCK", 20)  # later turns' prompt pieces (past ROWS) in blocks
    engine = open_engine(model, tmp_path / "data", weights="bf16", block_tokens=16, spill_idle_s=3600)
    ref = Reference(model, weights="bf16")
    try:
        assert engine.loaded.dtype == torch.bfloat16 and engine.loaded.device.type == "cpu"
        chat = [Message("user", "Describe the picture in a few words.", pics(make_picture(tmp_path / "a.png", 3)))]
        d1 = expect_done(ask(engine, "c", chat, 6))
        assert d1.token_ids == ref.reply_ids(chat, 6)
        chat += [Message("assistant", d1.reply), Message("user", "And in more words?")]
        d2 = expect_done(ask(engine, "c", chat, 6))
        assert d2.stats.reused_tokens >= d1.stats.prompt_tokens
        assert d2.token_ids == ref.reply_ids(chat, 6)
        chat += [Message("assistant", d2.reply)]
        assert spill_now(engine, "c").state == "spilled"
        chat += [Message("user", "Which colour is it?")]
        d3 = expect_done(ask(engine, "c", chat, 6))
        assert d3.stats.restored_tokens > 0
        assert d3.token_ids == ref.reply_ids(chat, 6)
    finally:
        engine.shutdown()
