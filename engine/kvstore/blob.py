"""Blob files: one file per block (or session tail) holding every layer's K and V.

    fixed header  magic, version, kind, dtype, header_len, key, n_tokens, n_layers,
                  payload_len, payload BLAKE3
    shapes        n_layers x (k_heads, k_dim, v_heads, v_dim) as u32
    token ids     n_tokens x int64 LE
    header BLAKE3 over everything above, then zero padding to a 64-byte boundary
    payload       per layer: K [k_heads, n, k_dim] then V [v_heads, n, v_dim], raw bytes

One file per block (not per tensor) keeps the file count and the fsyncs per spill low, and lets a
restore fetch a block with one read. Both checksums are verified on every read.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import blake3
import numpy as np

from ..platform import files as platform_io
from .errors import BadBlob
from .layout import CODE_DTYPES, DTYPE_CODES, KVLayout, shape_row

MAGIC = b"PRLYKVB\x00"
BLOB_VERSION = 1
KIND_BLOCK = 0
KIND_TAIL = 1
SUFFIX = ".kvb"
TMP_SUFFIX = platform_io.TMP_SUFFIX  # temp files AtomicFile leaves after a crash (the sweep removes them)
_FIXED = struct.Struct("<8sHBBI32sIIQ32s")  # 96 bytes
_ALIGN = 64


def header_len(n_tokens: int, n_layers: int) -> int:
    raw = _FIXED.size + 16 * n_layers + 8 * n_tokens + 32
    return (raw + _ALIGN - 1) // _ALIGN * _ALIGN


def blob_size(layout: KVLayout, n_tokens: int) -> int:
    return header_len(n_tokens, layout.n_layers) + n_tokens * layout.token_bytes


def blob_path(blobs_dir: str, key: bytes) -> str:
    """Fan-out by the first key byte: 256 directories keep listings short at any store size."""
    h = key.hex()
    return os.path.join(blobs_dir, h[:2], h + SUFFIX)


def encode_header(kind: int, layout: KVLayout, key: bytes, tokens: np.ndarray, payload_digest: bytes) -> bytes:
    n = len(tokens)
    payload_len = n * layout.token_bytes
    hl = header_len(n, layout.n_layers)
    body = bytearray(
        _FIXED.pack(
            MAGIC,
            BLOB_VERSION,
            kind,
            DTYPE_CODES[layout.dtype],
            hl,
            key,
            n,
            layout.n_layers,
            payload_len,
            payload_digest,
        )
    )
    body += np.asarray(layout.shapes, dtype="<u4").tobytes()
    body += np.ascontiguousarray(tokens, dtype="<i8").tobytes()
    body += blake3.blake3(bytes(body)).digest()
    body += bytes(hl - len(body))
    return bytes(body)


@dataclass
class BlobHeader:
    kind: int
    layout: KVLayout
    key: bytes
    tokens: np.ndarray
    header_len: int
    payload_len: int
    payload_digest: bytes


def parse_fixed(buf) -> tuple:
    """Just the fixed fields (to learn a blob's layout before allocating); raises BadBlob."""
    if len(buf) < _FIXED.size:
        raise BadBlob("truncated header")
    fields = _FIXED.unpack_from(buf, 0)
    if fields[0] != MAGIC:
        raise BadBlob("bad magic")
    if fields[1] != BLOB_VERSION:
        raise BadBlob(f"blob format version {fields[1]} (expected {BLOB_VERSION})")
    return fields


def parse_header(buf) -> BlobHeader:
    """Parse and verify a blob header (its own BLAKE3). `buf` holds at least the header."""
    magic, _ver, kind, dcode, hl, key, n, n_layers, payload_len, pdigest = parse_fixed(buf)
    if dcode not in CODE_DTYPES or kind not in (KIND_BLOCK, KIND_TAIL):
        raise BadBlob("bad dtype or kind")
    if n_layers > 1 << 16 or n > 1 << 24 or hl != header_len(n, n_layers) or len(buf) < hl:
        raise BadBlob("inconsistent header length")
    off = _FIXED.size
    shapes = np.frombuffer(buf, dtype="<u4", count=4 * n_layers, offset=off).reshape(n_layers, 4)
    off += 16 * n_layers
    tokens = np.frombuffer(buf, dtype="<i8", count=n, offset=off).copy()
    off += 8 * n
    if blake3.blake3(memoryview(buf)[:off]).digest() != bytes(buf[off : off + 32]):
        raise BadBlob("header checksum mismatch")
    layout = KVLayout(CODE_DTYPES[dcode], tuple(shape_row(row) for row in shapes))
    if payload_len != n * layout.token_bytes:
        raise BadBlob("payload length does not match shapes")
    return BlobHeader(kind, layout, bytes(key), tokens, hl, payload_len, bytes(pdigest))
