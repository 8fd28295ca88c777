"""Restore planning: which stored blobs make the longest valid prefix of a new prompt.

The prompt's own chained block keys are the lookup: a key names its whole prefix (tokens and
pictures), so block i can come from this session's row or from any session holding that key.
The session's tail (a partial block) is usable only when all of the session's blocks matched;
it is compared token by token and picture by picture. Reading and verification: reader.py.
"""
from __future__ import annotations

import logging
import math
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np
import torch

from ..devices import synchronize
from .blob import KIND_BLOCK, KIND_TAIL
from .errors import BadBlob, MissingBlob
from .keys import PictureSpan, block_keys, normalize_pictures, normalize_tokens
from .layout import build_cache
from .manifest import SessionRow
from .reader import BlobReader, ReadItem, read_layout

if TYPE_CHECKING:
    from .store import KVStore

log = logging.getLogger(__name__)


@dataclass
class RestoreResult:
    cache: Any | None          # transformers DynamicCache holding n_tokens tokens, or None
    n_tokens: int
    state: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)


def restore(store: "KVStore", session_id: str | None, token_ids: Any, picture_spans: Iterable[Any],
            device: str | torch.device, dtype: torch.dtype | None, namespace: bytes | str | None,
            max_tokens: int | None, shared: bool, cut_pictures: bool) -> RestoreResult:
    t0 = time.perf_counter()
    tokens = normalize_tokens(token_ids)
    pictures = normalize_pictures(picture_spans)
    ns = store._ns(namespace)
    B = store.block_tokens
    limit = len(tokens) if max_tokens is None else max(0, min(len(tokens), int(max_tokens)))
    keys = block_keys(ns, tokens, pictures, B, limit_blocks=math.ceil(limit / B))
    stats: dict[str, Any] = {"source": "none", "blobs_read": 0, "bytes_read": 0, "bad_blobs": 0,
                             "missing_blobs": 0, "session_tokens": 0, "state_complete": False}

    def done(cache: Any = None, n: int = 0, state: dict | None = None) -> RestoreResult:
        stats["seconds"] = time.perf_counter() - t0
        return RestoreResult(cache, n, state or {}, stats)

    with store._lock:
        store._check_open()
        row = store._manifest.session(session_id) if session_id is not None else None
        usable = row is not None and row.namespace == ns and row.block_tokens == B
        own = row.block_keys if usable else []
        present = store._manifest.blob_sizes(keys) if shared else {}
        chain: list[bytes] = []
        from_own = 0
        for i, k in enumerate(keys):
            if i < len(own) and own[i] == k:
                from_own += 1
            elif k not in present:
                break
            chain.append(k)
        use_tail = (usable and row.tail_key is not None and from_own == len(own) == len(chain)
                    and len(own) * B < limit)
        pins = chain + ([row.tail_key] if use_tail else [])
        store._read_pins.update(pins)  # no eviction or GC deletes them while we read
    try:
        if usable:
            stats["session_tokens"] = row.n_tokens
        if not pins:
            return done()
        stats["source"] = ("session" if from_own == len(chain) else
                           "shared" if from_own == 0 else "session+shared")
        try:
            layout = row.layout if usable else read_layout(store._path(chain[0]))
        except (BadBlob, MissingBlob) as e:
            store._blob_failed(chain[0], "missing" if isinstance(e, MissingBlob) else "bad", stats, str(e))
            return done()
        n_plan = min(limit, len(chain) * B + (row.tail_tokens if use_tail else 0))
        if cut_pictures:
            n_plan = cut_at_pictures(n_plan, pictures)
        items = []
        for i, k in enumerate(chain):
            if i * B >= n_plan:
                break
            items.append(ReadItem(k, store._path(k), KIND_BLOCK, i * B, B, min(B, n_plan - i * B),
                                  tokens[i * B:(i + 1) * B]))
        base = len(chain) * B
        if use_tail and n_plan > base:
            items.append(ReadItem(row.tail_key, store._path(row.tail_key), KIND_TAIL, base, row.tail_tokens,
                                  n_plan - base, None, tail_acceptor(tokens, pictures, row, base)))
        if not items:
            return done()
        dev = torch.device(device)
        out_dtype = dtype or layout.dtype
        dest = [(torch.empty((1, kh, n_plan, kd), dtype=out_dtype, device=dev),
                 torch.empty((1, vh, n_plan, vd), dtype=out_dtype, device=dev))
                for kh, kd, vh, vd in layout.shapes]
        if store._reader is None:
            store._reader = ThreadPoolExecutor(BlobReader.DEPTH, thread_name_prefix="kvstore-read")
        reader = BlobReader(layout, dest, store._reader)
        n = reader.run(items, lambda it, why, detail: store._blob_failed(it.key, why, stats, detail))
        stats["blobs_read"] = reader.blobs_read
        stats["bytes_read"] = reader.bytes_read
        if cut_pictures:
            n = cut_at_pictures(n, pictures)
        if n == 0:
            return done()
        if n < n_plan:
            dest = [(_shrink(k, n), _shrink(v, n)) for k, v in dest]
        synchronize(dev)  # CUDA / MPS copies may still be in flight
        stats["state_complete"] = bool(usable and n == row.n_tokens)
        with store._lock:
            store._counters["restores"] += 1
            store._counters["restored_tokens"] += n
            store._counters["restore_bytes"] += reader.bytes_read
            if usable and from_own and not store._closed:
                try:  # LRU: a restored session is in use; a failed touch must not fail the restore
                    store._manifest.touch(session_id, time.time())
                except Exception as e:
                    log.warning("kvstore: cannot record use of session %s: %s", session_id, e)
        return done(build_cache(dest), n, row.state if usable else {})
    finally:
        with store._lock:
            store._read_pins.subtract(pins)
            store._read_pins += Counter()  # drop zero counts


def cut_at_pictures(n: int, pictures: tuple[PictureSpan, ...]) -> int:
    """Move n back so it does not split a picture (its features are injected whole)."""
    changed = True
    while changed:
        changed = False
        for p in pictures:
            if p.start < n < p.end:
                n = p.start
                changed = True
    return n


def tail_acceptor(tokens: np.ndarray, pictures: tuple[PictureSpan, ...], row: SessionRow, base: int):
    """How many of a stored tail's tokens the new prompt shares: equal token ids, and the same
    pictures (same span, same key) over that range."""
    def accept(hdr) -> int:
        stored = hdr.tokens
        given = tokens[base:base + len(stored)]
        m = min(len(stored), len(given))
        diff = np.nonzero(stored[:m] != given[:m])[0]
        if len(diff):
            m = int(diff[0])
        end = base + m
        mine = {p for p in row.pictures if p.overlaps(base, end)}
        theirs = {p for p in pictures if p.overlaps(base, end)}
        for p in mine ^ theirs:
            end = min(end, max(base, p.start))
        return end - base
    return accept


def _shrink(t: torch.Tensor, n: int) -> torch.Tensor:
    """The first n tokens; copied out when the view would pin much unused memory."""
    view = t[:, :, :n, :]
    return view if n * 8 >= t.shape[2] * 7 else view.clone()
