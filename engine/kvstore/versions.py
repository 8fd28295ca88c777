"""Versions of a conversation in the store: rows named `<conversation id>#version-<prefix key>`.

When a chat's turn continues another version (an edit, a regenerate, a switch in the window), the
KV of the version being left is kept as a row of its own, named after the chained key of its whole
token prefix (keys.py: the key names every token and picture before it), so the same content is
always the same row. Its blocks are content-keyed like any other: the opening it shares with the
other versions is stored once.

Pure: which row of a conversation matches a prompt best is decided from the rows' block keys and
the prompt's own keys, without reading a blob (a row's tail matches when the prompt's tokens over
the tail's range hash to the tail's key).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..pictures.span import PictureSpan
from .keys import ZERO_KEY, BlockKey, block_keys, tail_key
from .manifest import SessionRow

VERSION_SEP = "#version-"


@dataclass(frozen=True)
class RowMatch:
    """A stored row and how much of a prompt it holds."""

    id: str
    n_tokens: int  # the prompt's opening the row surely holds (whole blocks, plus its tail when all of it matches)
    up_to: int  # and may hold: a tail matching in part is known only once read (its tokens are compared then)
    row_tokens: int  # all the tokens the row holds


def version_id(conversation_id: str, prefix_key: BlockKey) -> str:
    return f"{conversation_id}{VERSION_SEP}{prefix_key.hex()[:32]}"


def is_version(session_id: str) -> bool:
    return VERSION_SEP in session_id


def conversation_of(session_id: str) -> str:
    """The conversation a row belongs to (itself, for a conversation's own row)."""
    return session_id.split(VERSION_SEP, 1)[0]


def prefix_key(ns: bytes, tokens: np.ndarray, pictures: Sequence[PictureSpan], block_tokens: int) -> BlockKey:
    """The chained key of the whole of `tokens` (its tail's key, or its last block's): it names the prefix."""
    keys = block_keys(ns, tokens, pictures, block_tokens)
    if len(tokens) > len(keys) * block_tokens:
        return tail_key(ns, keys[-1] if keys else ZERO_KEY, tokens, len(keys) * block_tokens, pictures)
    return keys[-1] if keys else ZERO_KEY


def row_prefix_key(row: SessionRow) -> BlockKey:
    return row.tail_key if row.tail_key is not None else row.block_keys[-1] if row.block_keys else ZERO_KEY


def match_row(
    row: SessionRow, ns: bytes, keys: Sequence[BlockKey], tokens: np.ndarray, pictures: Sequence[PictureSpan]
) -> RowMatch:
    """How many opening tokens of a prompt (`tokens`, its block keys `keys`) the row holds."""
    k = 0
    for mine, theirs in zip(row.block_keys, keys, strict=False):
        if mine != theirs:
            break
        k += 1
    B = row.block_tokens
    sure = k * B
    if k < len(row.block_keys) or row.tail_key is None or not row.tail_tokens:
        return RowMatch(row.id, sure, sure, row.n_tokens)
    end = sure + row.tail_tokens
    parent = row.block_keys[-1] if row.block_keys else ZERO_KEY
    if len(tokens) >= end and tail_key(ns, parent, tokens[:end], sure, pictures) == row.tail_key:
        return RowMatch(row.id, end, end, row.n_tokens)
    return RowMatch(row.id, sure, min(end, len(tokens)), row.n_tokens)


def row_matches(
    rows: Sequence[SessionRow],
    conversation_id: str,
    ns: bytes,
    tokens: np.ndarray,
    pictures: Sequence[PictureSpan],
    block_tokens: int,
) -> list[RowMatch]:
    """The conversation's own row (first, when stored) and its version rows (all under namespace
    `ns`), each with how much of the prompt it holds."""
    mine = sorted((r for r in rows if conversation_of(r.id) == conversation_id), key=lambda r: is_version(r.id))
    if not mine:
        return []
    keys = block_keys(ns, tokens, pictures, block_tokens)
    return [match_row(r, ns, keys, tokens, pictures) for r in mine]


def best_of(matches: Sequence[RowMatch]) -> RowMatch | None:
    """The row surely holding the longest opening, then the one that may hold the most (the
    conversation's own row wins a tie); None when none may hold any of it."""
    best: RowMatch | None = None
    for m in matches:
        if m.up_to and (best is None or (m.n_tokens, m.up_to) > (best.n_tokens, best.up_to)):
            best = m
    return best
