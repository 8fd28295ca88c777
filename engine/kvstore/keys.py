"""Content keys for KV blocks: chained BLAKE3 over namespace, parent, token ids and pictures.

A block's key names exactly the KV it holds: causal attention makes a token's K/V depend on every
token (and picture) before it, so each key chains its parent's key. Two conversations with the
same opening therefore get the same first keys and share blobs. Never Python `hash()`: it is
salted per process and far too short.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Any, NewType

import blake3
import numpy as np

from ..pictures.span import PictureSpan

# A block's (or tail's) content key: names the KV of its whole prefix, tokens and pictures.
BlockKey = NewType("BlockKey", bytes)

KEY_BYTES = 32
ZERO_KEY = BlockKey(bytes(KEY_BYTES))  # parent of the first block
FORMAT_VERSION = 1  # bump when the key derivation or the blob layout changes

_NS_TAG = b"parley.kvstore.namespace\x00"
_BLOCK_TAG = b"parley.kvstore.block\x00"
_TAIL_TAG = b"parley.kvstore.tail\x00"


def normalize_tokens(token_ids: Any) -> np.ndarray:
    """Token ids (list, numpy or torch, 1-D) as a contiguous little-endian int64 array."""
    if hasattr(token_ids, "detach"):  # torch tensor, possibly on a device
        token_ids = token_ids.detach().cpu().numpy()
    arr = np.ascontiguousarray(np.asarray(token_ids), dtype="<i8")
    if arr.ndim == 2 and arr.shape[0] == 1:  # tolerate [1, seq] input_ids
        arr = arr[0]
    if arr.ndim != 1:
        raise ValueError(f"token_ids must be 1-D, got shape {tuple(arr.shape)}")
    return arr


def normalize_pictures(spans: Iterable[PictureSpan] | None) -> tuple[PictureSpan, ...]:
    """Picture spans checked and sorted (the order their keys are hashed in)."""
    out = []
    for span in spans or ():
        if not isinstance(span, PictureSpan):
            raise TypeError(f"picture spans are PictureSpan, not {type(span).__name__}")
        if not (0 <= span.start < span.end):
            raise ValueError(f"bad picture span {span.start}..{span.end}")
        if not span.key or len(span.key) > 0xFFFF:
            raise ValueError("picture key must be 1..65535 bytes")
        out.append(span)
    return tuple(sorted(out))


def namespace_digest(namespace: bytes | str, block_tokens: int) -> bytes:
    """Fold the caller's model fingerprint, the block size and the format version into 32 bytes."""
    if isinstance(namespace, str):
        namespace = namespace.encode("utf-8")
    h = blake3.blake3(_NS_TAG)
    h.update(struct.pack("<IIQ", FORMAT_VERSION, block_tokens, len(namespace)))
    h.update(bytes(namespace))
    return h.digest()


def _pictures_bytes(pictures: Sequence[PictureSpan], a: int, b: int) -> bytes:
    parts = []
    for p in pictures:
        if p.overlaps(a, b):
            parts.append(struct.pack("<qqH", p.start, p.end, len(p.key)) + p.key)
    return struct.pack("<I", len(parts)) + b"".join(parts)


def _chunk_key(
    tag: bytes, ns: bytes, parent: BlockKey, tokens: np.ndarray, a: int, b: int, pictures: Sequence[PictureSpan]
) -> BlockKey:
    h = blake3.blake3(tag)
    h.update(ns)
    h.update(parent)
    h.update(struct.pack("<qI", a, b - a))
    h.update(tokens[a:b].data.cast("B"))  # fixed-width little-endian int64
    h.update(_pictures_bytes(pictures, a, b))
    return BlockKey(h.digest())


def block_keys(
    ns: bytes, tokens: np.ndarray, pictures: Sequence[PictureSpan], block_tokens: int, limit_blocks: int | None = None
) -> list[BlockKey]:
    """Chained keys of the full blocks of `tokens` (a trailing partial block gets none)."""
    n_blocks = len(tokens) // block_tokens
    if limit_blocks is not None:
        n_blocks = min(n_blocks, limit_blocks)
    keys: list[BlockKey] = []
    parent = ZERO_KEY
    for i in range(n_blocks):
        a = i * block_tokens
        parent = block_key(ns, parent, tokens, a, block_tokens, pictures)
        keys.append(parent)
    return keys


def block_key(
    ns: bytes, parent: BlockKey, tokens: np.ndarray, start: int, block_tokens: int, pictures: Sequence[PictureSpan]
) -> BlockKey:
    """Key of the one block at `start` (block_keys' step: checks a stored block against its name)."""
    return _chunk_key(_BLOCK_TAG, ns, parent, tokens, start, start + block_tokens, pictures)


def tail_key(ns: bytes, parent: BlockKey, tokens: np.ndarray, start: int, pictures: Sequence[PictureSpan]) -> BlockKey:
    """Key of the tokens past the last full block (its own domain: never equal to a block key)."""
    return _chunk_key(_TAIL_TAG, ns, parent, tokens, start, len(tokens), pictures)
