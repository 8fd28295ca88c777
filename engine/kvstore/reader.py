"""Reading blobs back: executes a restore.ReadPlan, one read per blob, verified, straight into
preallocated tensors.

For a CPU restore in the stored dtype the file is read (one preadv where the OS has it) into the
destination tensors' own memory (no staging copy); otherwise it lands in a staging buffer and is
copied (and cast, or moved to the device) per tensor. A read-ahead thread fetches the next blob
while this one is hashed. Nothing is handed out before its header checksum, payload checksum,
key, token ids and shapes check out; on the first failure the restore stops at the valid prefix.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import blake3
import numpy as np
import torch

from ..device.choice import synchronize
from ..pictures.span import cut_before
from ..platform.files import open_read, pread, read_into
from .blob import blob_size, header_len, parse_fixed, parse_header
from .errors import BadBlob, MissingBlob
from .layout import KVLayout
from .restore import ReadItem, ReadPlan


@dataclass
class ReadOutcome:
    tensors: list[tuple[torch.Tensor, torch.Tensor]] | None  # per layer (K, V) [1, H, n, D]; None if n == 0
    n_tokens: int
    blobs_read: int
    bytes_read: int


def read_prefix(
    plan: ReadPlan,
    layout: KVLayout,
    device: str | torch.device,
    dtype: torch.dtype | None,
    executor: ThreadPoolExecutor | None,
    on_fail: Callable[[ReadItem, str, str], None],
) -> ReadOutcome:
    """Read a plan into fresh tensors on `device` (cast to `dtype` if given). Stops at the first bad
    or missing blob (reported through on_fail); the result is the verified prefix, shortened so it
    never ends inside one of plan.keep_whole."""
    dev = torch.device(device)
    out_dtype = dtype or layout.dtype
    dest = [
        (
            torch.empty((1, kh, plan.n_tokens, kd), dtype=out_dtype, device=dev),
            torch.empty((1, vh, plan.n_tokens, vd), dtype=out_dtype, device=dev),
        )
        for kh, kd, vh, vd in layout.shapes
    ]
    reader = BlobReader(layout, dest, executor)
    n = cut_before(plan.first + reader.run(plan.items, on_fail), plan.keep_whole) - plan.first
    if n <= 0:
        return ReadOutcome(None, 0, reader.blobs_read, reader.bytes_read)
    if n < plan.n_tokens:
        dest = [(_shrink(k, n), _shrink(v, n)) for k, v in dest]
    synchronize(dev)  # CUDA / MPS copies may still be in flight
    return ReadOutcome(dest, n, reader.blobs_read, reader.bytes_read)  # tokens plan.first .. plan.first + n


def _shrink(t: torch.Tensor, n: int) -> torch.Tensor:
    """The first n tokens; copied out when the view would pin much unused memory."""
    view = t[:, :, :n, :]
    return view if n * 8 >= t.shape[2] * 7 else view.clone()


def read_layout(path: str) -> KVLayout:
    """The layout recorded in a blob's header (two small reads)."""
    try:
        fd = open_read(path)
    except FileNotFoundError as e:
        raise MissingBlob(path) from e
    try:
        fixed = pread(fd, 4096, 0)
        hl = parse_fixed(fixed)[4]
        buf = pread(fd, hl, 0) if hl > len(fixed) else fixed
        return parse_header(bytearray(buf)).layout
    finally:
        os.close(fd)


class BlobReader:
    """Fills per-layer destination tensors [1, heads, n_total, dim] from a list of ReadItems."""

    DEPTH = 2  # reads in flight ahead of verification (keeps the disk busy while we hash)

    def __init__(
        self, layout: KVLayout, dest: list[tuple[torch.Tensor, torch.Tensor]], executor: ThreadPoolExecutor | None
    ):
        self.layout = layout
        self.dest = dest
        self.executor = executor
        self.direct_ok = all(
            t.device.type == "cpu" and t.dtype == layout.dtype and t.is_contiguous() for pair in dest for t in pair
        )
        # byte views of the destinations, for preadv straight into tensor memory
        self.dest_u8 = [tuple(t.view(torch.uint8).numpy() for t in pair) for pair in dest] if self.direct_ok else None
        pin = any(t.device.type == "cuda" for pair in dest for t in pair) and torch.cuda.is_available()
        self._pin = pin
        self._staging: list[torch.Tensor | None] = [None] * (self.DEPTH + 1)
        self.bytes_read = 0
        self.blobs_read = 0

    def _stage(self, slot: int, nbytes: int) -> torch.Tensor:
        buf = self._staging[slot]
        if buf is None or buf.numel() < nbytes:
            buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self._pin)
            self._staging[slot] = buf
        return buf

    # -- phase 1 (read-ahead thread): bytes from disk
    def _load(self, item: ReadItem, slot: int):
        size = blob_size(self.layout, item.n)
        try:
            fd = open_read(item.path)
        except FileNotFoundError:
            return ("missing", None)
        except OSError as e:
            return ("bad", f"open failed: {e}")
        try:
            st = os.fstat(fd)
            if st.st_size != size:
                return ("bad", f"size {st.st_size} != expected {size}")
            hl = header_len(item.n, self.layout.n_layers)
            head: bytearray | memoryview = bytearray(hl)
            # ("direct", header, views of the destinations) or ("staged", header, the staging buffer)
            mode: tuple[str, bytearray | memoryview, list[memoryview] | torch.Tensor]
            if self.direct_ok and item.use == item.n:
                views = [memoryview(head)] + self._dest_views(item)
                got = read_into(fd, views)
                mode = ("direct", head, views[1:])
            else:
                buf = self._stage(slot, size)
                mv = buf.numpy().data[:size]
                got = read_into(fd, [mv])
                head = mv[:hl]
                mode = ("staged", head, buf)
            if got != size:
                return ("bad", f"short read {got} of {size}")
            return ("ok", mode)
        except OSError as e:
            return ("bad", f"read failed: {e}")
        finally:
            os.close(fd)

    def _dest_views(self, item: ReadItem) -> list[memoryview]:
        if self.dest_u8 is None:
            raise RuntimeError("direct reads need contiguous CPU destinations in the stored dtype")
        views = []
        a, b = item.start, item.start + item.n
        for layer, kv, heads, _dim, _off, _nb in self.layout.segments(item.n):
            arr = self.dest_u8[layer][kv]
            for h in range(heads):
                views.append(arr[0, h, a:b, :].data.cast("B"))
        return views

    # -- phase 2 (caller's thread): verify, then place
    def _verify(self, item: ReadItem, loaded) -> int:
        status, mode = loaded
        if status == "missing":
            raise MissingBlob(item.path)
        if status == "bad":
            raise BadBlob(mode)
        kind, head, payload = mode
        hdr = parse_header(head)
        if hdr.key != item.key or hdr.kind != item.kind:
            raise BadBlob("key or kind mismatch")
        if hdr.layout != self.layout:
            raise BadBlob("shapes/dtype differ from the session's")
        if len(hdr.tokens) != item.n:
            raise BadBlob("token count mismatch")
        hasher = blake3.blake3()
        if kind == "direct":
            for v in payload:
                hasher.update(v)
        else:
            hasher.update(payload.numpy().data[hdr.header_len : hdr.header_len + hdr.payload_len])
        if hasher.digest() != hdr.payload_digest:
            raise BadBlob("payload checksum mismatch")
        if item.expect is not None and not np.array_equal(hdr.tokens, item.expect):
            raise BadBlob("token ids differ")
        use = item.use if item.accept is None else min(item.use, item.accept(hdr))
        if kind == "staged" and use > 0:
            self._place(item, payload, hdr.header_len, use)
        return use

    def _place(self, item: ReadItem, buf: torch.Tensor, base: int, use: int) -> None:
        a = item.start
        for layer, kv, heads, dim, off, nbytes in self.layout.segments(item.n):
            dst = self.dest[layer][kv]
            if dst.dtype != self.layout.dtype:  # a cast was asked for
                src = buf[base + off : base + off + nbytes].view(self.layout.dtype).view(heads, item.n, dim)
                dst[0, :, a : a + use, :].copy_(src[:, :use, :])
                continue
            # bit copy through an integer view (see layout.RAW_DTYPES)
            raw = self.layout.raw_dtype
            src = buf[base + off : base + off + nbytes].view(raw).view(heads, item.n, dim)[:, :use, :]
            if dst.device.type == "cpu":
                np.copyto(dst.view(raw).numpy()[0, :, a : a + use, :], src.numpy())
            else:
                dst.view(raw)[0, :, a : a + use, :].copy_(src)

    def run(self, items: list[ReadItem], on_fail: Callable[[ReadItem, str, str], None]) -> int:
        """Read items in order; returns how many tokens from items[0].start were placed and
        verified. Stops at the first bad or missing blob (reported through on_fail)."""
        done = 0
        slots = self.DEPTH + 1
        pending: deque = deque()  # Futures (or loaded results without an executor), in item order

        def start(i: int) -> None:
            if self.executor is None:
                pending.append(self._load(items[i], i % slots))
            else:
                pending.append(self.executor.submit(self._load, items[i], i % slots))

        nxt = 0
        try:
            for i, item in enumerate(items):
                ahead = self.DEPTH if self.executor is not None else 0
                while nxt < len(items) and nxt <= i + ahead:
                    start(nxt)
                    nxt += 1
                head = pending.popleft()
                loaded = head.result() if isinstance(head, Future) else head
                try:
                    use = self._verify(item, loaded)
                except MissingBlob:
                    on_fail(item, "missing", "file not found")
                    return done
                except BadBlob as e:
                    on_fail(item, "bad", str(e))
                    return done
                self.bytes_read += blob_size(self.layout, item.n)
                self.blobs_read += 1
                done += use
                if use < item.n:
                    return done
            return done
        finally:
            for f in pending:
                if isinstance(f, Future):
                    f.result()  # never leave a read writing into memory we hand out
