"""A spill job: device->host copies on the caller's thread, file writes on the writer thread.

    job = store.begin_spill(...)      # keys, memo lookup, plan (cheap; no copies yet)
    while not job.step(): ...         # one unit (<= unit_bytes) copied and handed over per call
    del cache                          # the job dropped its references: the device memory can go
    result = job.result()             # waits for the writer and the manifest commit

Only blocks that are not already on disk are copied off the device at all. A job is given only
what it needs: the store's index (pins, commit, release), the writer thread and the buffer pool.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import blake3
import numpy as np
import torch

from ..pictures.span import PictureSpan
from ..platform.files import AtomicFile, sync_dir
from .blob import KIND_BLOCK, KIND_TAIL, encode_header, header_len
from .index import StoreIndex
from .layout import KVLayout
from .manifest import SessionRow
from .spill_records import BlobPlan, SpillResult
from .writer import BufferPool, WriterThread

log = logging.getLogger(__name__)


class _Piece(NamedTuple):
    """One contiguous run of payload bytes to copy: heads h0:h1, rows t0:t1 of one tensor of one blob."""

    wi: int  # index into the blobs to write
    layer: int
    kv: int  # 0: K, 1: V
    h0: int
    h1: int
    t0: int
    t1: int
    nbytes: int
    last: bool  # the blob's last piece: close it after writing


@dataclass
class _Sink:
    file: AtomicFile
    hasher: blake3.blake3 = field(default_factory=blake3.blake3)


class SpillJob:
    def __init__(
        self,
        index: StoreIndex,
        writer: WriterThread,
        pool: BufferPool,
        *,
        durable: bool,
        block_tokens: int,
        session_id: str,
        ns: bytes,
        tokens: np.ndarray,
        pictures: tuple[PictureSpan, ...],
        layout: KVLayout,
        kv: list[tuple[torch.Tensor, torch.Tensor]],
        plans: list[BlobPlan],
        state_json: str,
        missing: int,
    ):
        self.session_id = session_id
        self.block_tokens = block_tokens
        self.ns = ns
        self.tokens = tokens
        self.pictures = pictures
        self.layout = layout
        self.plans = plans
        self.state_json = state_json
        self._index = index
        self._writer = writer
        self._pool = pool
        self._durable = durable
        # held only until every unit is copied; bit-exact integer views (layout.RAW_DTYPES), as
        # numpy arrays for CPU tensors: torch's per-op overhead and thread pool cost 5-50x here
        raw = layout.raw_dtype
        self._kv: list[tuple[np.ndarray | torch.Tensor, ...]] | None  # None once handed over
        self._kv = [
            tuple(t.detach().view(raw).numpy() if t.device.type == "cpu" else t.detach().view(raw) for t in pair)
            for pair in kv
        ]
        self._to_write = [p for p in plans if p.write]
        # a small job is cut into ~4 units (>= 1 MiB) so the writer starts while copies go on
        total = sum(p.size for p in self._to_write)
        self._unit = min(pool.nbytes, max(1 << 20, total // 4))
        self._pieces: Iterator[_Piece] | None = self._piece_iter(self._unit)
        self._next = next(self._pieces, None)
        self._handed_over = False
        self._failed: str | None = None
        self._sinks: dict[int, _Sink] = {}
        self.written: list[BlobPlan] = []  # renamed into place, durable
        self._dirs: set[str] = set()
        self._done = threading.Event()
        self._result: SpillResult | None = None
        self._t0 = time.perf_counter()
        self.stats = SpillResult(
            ok=False,
            session_id=session_id,
            n_tokens=len(tokens),
            missing_blobs=missing,
            reused_blobs=sum(1 for p in plans if not p.write),
            reused_bytes=sum(p.size for p in plans if not p.write),
        )

    # ---------------------------------------------------------------- owner thread
    def step(self, block: bool = True) -> bool:
        """Copy one unit off the device and hand it to the writer. True once every copy has been
        handed over (after which the caller may free its cache). With block=False, returns False
        without copying when the writer's backlog is full."""
        if self._handed_over:
            return True
        if self._failed:
            self._hand_over_end()
            return True
        if self._next is None:
            self._hand_over_end()
            return True
        src_kv, pieces_left = self._kv, self._pieces
        if src_kv is None or pieces_left is None:  # both are dropped only at the hand-over (returned above)
            raise RuntimeError("spill job stepped after its copies were handed over")
        pool = self._pool
        buf = pool.acquire(block)
        if buf is None:
            return False
        t = time.perf_counter()
        pieces: list[tuple[_Piece, int]] = []  # each with its offset in buf
        used = 0
        buf_np = buf.numpy()
        raw = self.layout.raw_dtype
        raw_np = np.int32 if self.layout.itemsize == 4 else np.int16
        try:
            while self._next is not None:
                p = self._next
                wi, layer, kv, h0, h1, t0, t1, nbytes, _last = p
                if pieces and used + nbytes > self._unit:
                    break
                plan = self._to_write[wi]
                src = src_kv[layer][kv][0, h0:h1, plan.start + t0 : plan.start + t1, :]
                if isinstance(src, np.ndarray):  # CPU cache: plain memcpy, no intra-op thread pool
                    np.copyto(buf_np[used : used + nbytes].view(raw_np).reshape(src.shape), src)
                else:  # device->host into the (pinned) buffer; synchronous: done on return
                    buf[used : used + nbytes].view(raw).view(src.shape).copy_(src)
                pieces.append((p, used))
                used += nbytes
                self._next = next(pieces_left, None)
        except Exception as e:  # e.g. a device error: nothing was committed, the cache is intact
            pool.release(buf)
            self.fail(f"device->host copy failed: {e!r}")
            self._hand_over_end()
            return True
        self.stats.copy_seconds += time.perf_counter() - t
        self._writer.submit(self._write_unit, buf, pieces)
        if self._next is None:
            self._hand_over_end()
        return self._handed_over

    def ready(self) -> bool:
        """Whether step() would not block (a host buffer is free, or nothing is left to copy)."""
        return self._handed_over or self._failed is not None or self._next is None or self._pool.available()

    @property
    def copies_done(self) -> bool:
        return self._handed_over

    def run_copies(self) -> None:
        while not self.step():
            pass

    def cancel(self) -> None:
        """Abandon a job whose copies are not all handed over: nothing is installed."""
        if not self._handed_over:
            self.fail("cancelled")
            self._hand_over_end()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> SpillResult | None:
        """Wait for the writer and the manifest commit. Call after step() returned True."""
        if not self._handed_over:
            raise RuntimeError("wait() before all copies were handed over: call step() until it returns True")
        if not self._done.wait(timeout):
            return None
        return self._result

    def result(self) -> SpillResult:
        return self.wait(None)  # type: ignore[return-value]

    # ---------------------------------------------------------------- internals
    def _piece_iter(self, unit_bytes: int) -> Iterator[_Piece]:
        """Contiguous payload pieces of each blob to write, each <= unit_bytes: whole tensors
        when they fit, else groups of heads, else row ranges of one head."""
        item = self.layout.itemsize
        for wi, plan in enumerate(self._to_write):
            n = plan.n
            segs = list(self.layout.segments(n))
            for si, (layer, kv, heads, dim, _off, _nb) in enumerate(segs):
                per_head = n * dim * item
                if per_head <= unit_bytes:
                    step = max(1, unit_bytes // per_head)
                    for h0 in range(0, heads, step):
                        h1 = min(heads, h0 + step)
                        last = si == len(segs) - 1 and h1 == heads
                        yield _Piece(wi, layer, kv, h0, h1, 0, n, (h1 - h0) * per_head, last)
                else:
                    rows = max(1, unit_bytes // (dim * item))
                    for h in range(heads):
                        for t0 in range(0, n, rows):
                            t1 = min(n, t0 + rows)
                            last = si == len(segs) - 1 and h == heads - 1 and t1 == n
                            yield _Piece(wi, layer, kv, h, h + 1, t0, t1, (t1 - t0) * dim * item, last)

    def _hand_over_end(self) -> None:
        if self._handed_over:
            return
        self._handed_over = True
        self._kv = None  # drop our references: the caller may free the device cache now
        self._pieces = None
        self._writer.submit(self._finish)

    def fail(self, message: str) -> None:
        if self._failed is None:
            self._failed = message

    @property
    def failed(self) -> str | None:
        return self._failed

    # ---------------------------------------------------------------- writer thread
    def _write_unit(self, buf: torch.Tensor, pieces: list[tuple[_Piece, int]]) -> None:
        try:
            if self._failed:
                return
            mv = buf.numpy().data
            for p, off in pieces:
                wi, nbytes, last = p.wi, p.nbytes, p.last
                sink = self._sinks.get(wi)
                if sink is None:
                    sink = self._open(wi)
                data = mv[off : off + nbytes]
                sink.hasher.update(data)
                sink.file.write(data)
                if last:
                    self._close(wi)
        except Exception as e:
            self.fail(f"writing blob failed: {e}")
        finally:
            self._pool.release(buf)

    def _open(self, wi: int) -> _Sink:
        plan = self._to_write[wi]
        sink = _Sink(AtomicFile(plan.path, self._durable))
        self._sinks[wi] = sink
        # placeholder header; the real one (with the payload checksum) is written at the end
        sink.file.write(bytes(header_len(plan.n, self.layout.n_layers)))
        return sink

    def _close(self, wi: int) -> None:
        plan = self._to_write[wi]
        sink = self._sinks.pop(wi)
        try:
            header = encode_header(
                plan.kind, self.layout, plan.key, self.tokens[plan.start : plan.end], sink.hasher.digest()
            )
            sink.file.pwrite(header, 0)
            if sink.file.size != plan.size:
                raise OSError(f"blob size {sink.file.size} != expected {plan.size}")
            sink.file.commit()  # sync + publish; the directory is synced before the commit
        except BaseException:
            sink.file.discard()
            raise
        self.written.append(plan)
        self._dirs.add(os.path.dirname(plan.path))  # os.sep: "\\" on Windows
        if plan.kind == KIND_TAIL:
            self.stats.tail_written += 1
        else:
            self.stats.blocks_written += 1
        self.stats.bytes_written += plan.size

    def _finish(self) -> None:
        """After the job's last unit: commit it through the index, or clean up. Always completes
        the job (a waiter must never hang)."""
        ok = False
        try:
            if not self._failed:
                try:
                    if self._durable:
                        for d in sorted(self._dirs):
                            sync_dir(d)  # the renames are durable before the row naming them
                    self._index.commit_job(self, self._session_row())
                    ok = True
                except Exception as e:
                    self.fail(f"installing the session failed: {e}")
            self._discard_open()
            self.stats.evicted_sessions = self._index.release_job(self, ok)
        except Exception:
            log.exception("kvstore: cleanup after a spill failed")  # the startup sweep tidies up
        finally:
            self._complete(ok)

    def _session_row(self) -> SessionRow:
        tail = next((p for p in self.plans if p.kind == KIND_TAIL), None)
        return SessionRow(
            id=self.session_id,
            namespace=self.ns,
            block_tokens=self.block_tokens,
            block_keys=[p.key for p in self.plans if p.kind == KIND_BLOCK],
            tail_key=tail.key if tail else None,
            tail_tokens=tail.n if tail else 0,
            n_tokens=len(self.tokens),
            pictures=self.pictures,
            layout=self.layout,
            state_json=self.state_json,
            bytes=sum(p.size for p in self.plans),
            last_used=time.time(),
        )

    def _discard_open(self) -> None:
        for sink in self._sinks.values():
            sink.file.discard()
        self._sinks.clear()

    def _complete(self, ok: bool) -> None:
        self.stats.ok = ok
        if not ok:
            self.stats.error = self._failed
        self.stats.seconds = time.perf_counter() - self._t0
        self._result = self.stats
        self._done.set()
