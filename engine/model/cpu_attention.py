"""Attention of a language model on a CPU: a decoded token's in two small products in fp32, a long
prompt piece's in blocks of rows; everything else through transformers' SDPA, unchanged.

A decoded token. torch 2.14.1's CPU SDPA (its flash kernel) is slow for a single query row, most
of all in bf16. At Qwen2-VL-2B's shape (12 query heads over 2 KV heads, 128 wide), 28 layers'
attention for one new token in bf16 took 17.7 ms at 512 tokens of context and 68.9 ms at 2048;
q·Kᵀ, softmax and ·V in fp32 take 3.4 and 7.7 ms, and land closer to exact arithmetic. In fp32:
SDPA 0.9 / 2.6 / 13.7 / 79.5 ms at 128 / 512 / 2048 / 8192 tokens, the products 0.7 / 2.1 / 8.0 /
30.2 ms (2-core Zen 4 with AVX512_BF16, quiet; a whole bf16 decode step there is ~100 ms). Leaving
the probabilities in bf16 for ·V, as the flash kernel does, would save 1.2 ms at 2048 for its
error too (largest 5.8e-4 against 9e-8 before the output is rounded to bf16), so it is not done.
So a call of up to ROWS rows (a decoded token, a prompt-lookup draft, the short end of a prompt)
takes the fp32 products.

A long prompt piece after earlier tokens. Given a mask, SDPA computes every row against every key
and masks afterwards: the causal half is computed for nothing. A picture is never cut between
prefill pieces (engine/local/runner.py), so a 60-frame clip of 5,800 tokens after a 15-token
system line is one piece of 5,800 rows over 5,815 keys. Split into BLOCK rows that each see only
the keys up to their last row's, the same piece (bf16, Qwen2-VL-2B's shape, text tokens, 2-core
Zen 4, interleaved runs) prefilled in 44.4 s with blocks of 512 rows (45.5 with 1024) instead of
58.5-72.6, and a 5,800-token prompt in 2,048-token pieces in 39.9 s instead of 42.1-45.0.

Softcapped or biased attention, other devices and masks of other shapes go to SDPA as they are.
The KV of a prompt and of a decoded token depend on this arithmetic, so LAYOUT is part of the KV
store namespace (load.py's fingerprint).
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "parley_cpu_attention"
LAYOUT = "cpu-attention-v2"  # in the KV store namespace: change it when the arithmetic changes (v1: decoded rows only)
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
# a decoded token with its prompt-lookup draft (engine/local/lookup_decode.py drafts up to 10):
# the same arithmetic whether a token is decoded alone or verified in a draft
ROWS = 16
BLOCK = 512  # query rows per SDPA call in a long masked call (see _blocks)


def applies(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a language model on `device` computing in `dtype` attends through this module."""
    return device.type == "cpu" and dtype in FLOATS


def use(model) -> None:
    """Switch the language model (not the vision tower, whose rows are many) to `attention`. Set on
    the language model itself: through the whole model transformers visits the vision tower too,
    and the demo model's LeViT logs that it cannot switch (at every `make run`)."""
    model.get_decoder().set_attn_implementation(NAME)


def _plain(query: torch.Tensor, dropout: float, kwargs) -> bool:
    """A call this module may compute itself: on a CPU, no dropout, no softcap, sinks or bias."""
    return (
        query.device.type == "cpu"
        and not dropout
        and not any(kwargs.get(k) is not None for k in ("softcap", "s_aux", "position_bias"))
    )


def _few_rows(query: torch.Tensor, attention_mask, dropout: float, kwargs) -> bool:
    if query.shape[2] > ROWS or query.dtype not in FLOATS or not _plain(query, dropout, kwargs):
        return False
    rows = query.shape[2]
    if attention_mask is None:  # no mask: one row sees every key; several would need causal alignment
        return rows == 1
    return attention_mask.dim() == 4 and attention_mask.shape[1] == 1


def attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [batch, heads, rows, dim]
    key: torch.Tensor,  # [batch, kv heads, length, dim]
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; returns [batch, rows, heads, dim] as SDPA's does."""
    if not _few_rows(query, attention_mask, dropout, kwargs):
        if _in_blocks(query, attention_mask, dropout, kwargs):
            return _blocks(module, query, key, value, attention_mask, scaling, kwargs)
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    batch, heads, rows, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    # query heads sharing a KV head are adjacent (transformers' repeat_kv order): their rows are
    # one product with that head's keys, so K and V are never repeated
    q = query.float().reshape(batch, kv_heads, groups * rows, dim)  # query arrives transposed
    scores = torch.matmul(q, key.float().transpose(-1, -2)).mul_(dim**-0.5 if scaling is None else scaling)
    if attention_mask is not None:  # [batch, 1, rows, length]: True (or 0.0) where a key may be seen
        grouped = scores.view(batch, kv_heads, groups, rows, -1)
        mask = attention_mask.unsqueeze(2)
        if mask.dtype == torch.bool:
            grouped.masked_fill_(~mask, float("-inf"))
        else:
            grouped.add_(mask.float())
    out = torch.matmul(scores.softmax(-1), value.float())
    return out.view(batch, heads, rows, dim).to(query.dtype).transpose(1, 2).contiguous(), None


def _in_blocks(query: torch.Tensor, attention_mask, dropout: float, kwargs) -> bool:
    """A long call with a mask (a prompt piece after earlier tokens): worth splitting by rows."""
    return (
        query.shape[2] > BLOCK
        and query.shape[0] == 1
        and _plain(query, dropout, kwargs)
        and attention_mask is not None
        and attention_mask.dtype == torch.bool
        and attention_mask.dim() == 4
        and attention_mask.shape[:2] == (1, 1)
    )


def _blocks(module, query, key, value, attention_mask, scaling, kwargs) -> tuple[torch.Tensor, None]:
    """SDPA over BLOCK query rows at a time, each block given only the keys up to the last one
    any of its rows may see. With a mask SDPA computes every row against every key; a causal
    mask hides the keys past each row, so a block of rows near the start of a long piece needs
    only the keys before it."""
    rows, length = query.shape[2], key.shape[2]
    out = []
    for a in range(0, rows, BLOCK):
        b = min(rows, a + BLOCK)
        mask = attention_mask[:, :, a:b]
        seen = length - (rows - b)  # causal: the block's last row sees the keys up to its own
        if bool(mask[..., seen:].any()):  # some row sees further (a picture's keys both ways)
            seen = length
        part, _ = sdpa_attention_forward(
            module,
            query[:, :, a:b],
            key[:, :, :seen],
            value[:, :, :seen],
            mask[..., :seen],
            scaling=scaling,
            is_causal=False,
            **kwargs,
        )
        out.append(part)
    return torch.cat(out, dim=1), None


AttentionInterface.register(NAME, attention)
AttentionMaskInterface.register(NAME, sdpa_mask)  # the same masks SDPA is given
