"""Restoring one session's own stored KV, a blob per step, without its prompt.

Opening a chat restores its KV before the person asks (engine/local/resume_ahead.py): no new
prompt exists yet, so the tokens come from the blobs themselves, and each block is checked against
its name instead: a block's key is BLAKE3 over the parent key, its token ids and the pictures over
it (keys.py), so recomputing it from the header's tokens and the row's pictures proves the tokens
are the ones that were spilled under that chain. The session's tail is checked the same way. A
blob that fails any check ends the restore at the verified prefix and is counted and discarded,
as in every restore.

`step()` reads and verifies one blob, so the owner thread can look at its queue between blobs
and give way to a turn. The destination tensors are allocated when the job begins (the caller
checked that memory allows them); `cancel()` lets them go.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ..device.choice import synchronize
from ..pictures.span import PictureSpan
from .blob import KIND_BLOCK, KIND_TAIL, BlobHeader, blob_size
from .errors import BadBlob
from .keys import ZERO_KEY, BlockKey, block_key, tail_key
from .layout import KVLayout, build_cache
from .manifest import SessionRow
from .reader import BlobReader
from .restore import ReadItem


@dataclass
class SessionRestore:
    """What a finished job holds: the KV of `ids` (with `pictures` over them) in `cache`."""

    cache: object | None  # transformers DynamicCache, None when nothing verified
    ids: list[int]
    pictures: tuple[PictureSpan, ...]
    state: dict = field(default_factory=dict)
    complete: bool = False  # every token of the row was restored (the state describes them)
    bytes_read: int = 0
    seconds: float = 0.0  # time spent in steps (reading, checking, placing), not between them

    @property
    def n_tokens(self) -> int:
        return len(self.ids)


def kv_bytes(layout: KVLayout, n_tokens: int, dtype: torch.dtype | None) -> int:
    """Memory the KV of n tokens takes once restored (in `dtype`, else the stored dtype)."""
    size = torch.empty((), dtype=dtype or layout.dtype).element_size()
    return n_tokens * size * sum(kh * kd + vh * vd for kh, kd, vh, vd in layout.shapes)


class SessionRestoreJob:
    def __init__(
        self,
        row: SessionRow,
        ns: bytes,
        path_of: Callable[[bytes], str],
        device,
        dtype,
        on_fail: Callable[[ReadItem, str, str], None],
        on_done: Callable[[SessionRestoreJob], None],
        blobs: int | None = None,
    ):
        self.row = row
        self.ns = ns
        self.B = row.block_tokens
        self._items = self._plan(path_of)[:blobs]  # `blobs`: only the first few (a speed probe)
        self.probe = blobs is not None  # read to time the disk, never used as a restore
        self.n_tokens = sum(it.n for it in self._items)  # planned
        self.tokens = np.zeros(row.n_tokens, dtype=np.int64)
        self.done_tokens = 0
        self.bytes_read = 0
        self.seconds = 0.0
        self._on_fail = on_fail
        self._on_done = on_done  # counts the restore and unpins, once
        self._finished = False
        self._failed = False
        self.cancelled = False  # let go before the end: nothing of it is used
        dev = torch.device(device)
        self.device = dev
        out_dtype = dtype or row.layout.dtype
        self.dest = [
            (
                torch.empty((1, kh, self.n_tokens, kd), dtype=out_dtype, device=dev),
                torch.empty((1, vh, self.n_tokens, vd), dtype=out_dtype, device=dev),
            )
            for kh, kd, vh, vd in row.layout.shapes
        ]
        self._reader = BlobReader(row.layout, self.dest, None)
        self._next = 0

    @property
    def nbytes(self) -> int:
        """Bytes the whole restore reads from disk."""
        return sum(blob_size(self.row.layout, it.n) for it in self._items)

    def _plan(self, path_of: Callable[[bytes], str]) -> list[ReadItem]:
        row, B = self.row, self.B
        items = []
        parent: BlockKey = ZERO_KEY
        for i, key in enumerate(row.block_keys):
            items.append(
                ReadItem(key, path_of(key), KIND_BLOCK, i * B, B, B, None, self._check_block(i * B, parent, key))
            )
            parent = key
        if row.tail_key is not None and row.tail_tokens:
            start = len(row.block_keys) * B
            items.append(
                ReadItem(
                    row.tail_key,
                    path_of(row.tail_key),
                    KIND_TAIL,
                    start,
                    row.tail_tokens,
                    row.tail_tokens,
                    None,
                    self._check_tail(start, parent, row.tail_key),
                )
            )
        return items

    def _check_block(self, start: int, parent: BlockKey, key: BlockKey):
        def accept(hdr: BlobHeader) -> int:
            self.tokens[start : start + self.B] = hdr.tokens
            if block_key(self.ns, parent, self.tokens, start, self.B, self.row.pictures) != key:
                raise BadBlob("its tokens do not hash to its key")
            return self.B

        return accept

    def _check_tail(self, start: int, parent: BlockKey, key: BlockKey):
        def accept(hdr: BlobHeader) -> int:
            n = len(hdr.tokens)
            self.tokens[start : start + n] = hdr.tokens
            if tail_key(self.ns, parent, self.tokens[: start + n], start, self.row.pictures) != key:
                raise BadBlob("its tokens do not hash to its key")
            return n

        return accept

    @property
    def finished(self) -> bool:
        return self._finished

    def step(self) -> bool:
        """Read and verify the next blob; True once the job is over (all read, or a blob failed)."""
        if self._finished:
            return True
        t0 = time.perf_counter()
        item = self._items[self._next]

        def failed(it: ReadItem, why: str, detail: str) -> None:
            self._failed = True
            self._on_fail(it, why, detail)

        used = self._reader.run([item], failed)
        self.seconds += time.perf_counter() - t0
        if used == item.n and not self._failed:
            self.done_tokens += used
            self.bytes_read += blob_size(self.row.layout, item.n)
            self._next += 1
        if self._failed or used < item.n or self._next == len(self._items):
            self._finish()
        return self._finished

    def run(self) -> None:
        """The remaining steps at once (a turn of this conversation needs them now)."""
        while not self.step():
            pass

    def _finish(self) -> None:
        self._finished = True
        self._on_done(self)

    def cancel(self) -> None:
        """Stop here; the memory of the tensors is let go with the job."""
        if not self._finished:
            self._failed = True
            self.cancelled = True
            self._finish()
        self.dest = []

    def result(self) -> SessionRestore:
        n = self.done_tokens
        if n == 0 or not self.dest:
            return SessionRestore(None, [], (), bytes_read=self.bytes_read, seconds=self.seconds)
        t0 = time.perf_counter()
        tensors = (
            self.dest
            if n == self.n_tokens
            else [(k[:, :, :n, :].clone(), v[:, :, :n, :].clone()) for k, v in self.dest]
        )
        synchronize(self.device)  # CUDA / MPS copies may still be in flight
        self.seconds += time.perf_counter() - t0
        self.dest = []
        complete = n == self.row.n_tokens
        pictures = tuple(p for p in self.row.pictures if p.start < n)  # a last one may be partly held
        return SessionRestore(
            build_cache(tensors),
            self.tokens[:n].tolist(),
            pictures,
            self.row.state if complete else {},
            complete,
            self.bytes_read,
            self.seconds,
        )
