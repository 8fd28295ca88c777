"""The manifest: which sessions exist, which blobs they reference, and refcounts (SQLite, WAL).

A session row is the persisted memo of a spill: its ordered block keys and tail key survive a
restart, so the next spill (even from a new process) references blocks already on disk. Refcounts
count sessions referencing a blob and change in the same transaction that installs or drops a
session row, so a crash leaves either the old row with its refs or the new one with its refs.
The caller serializes access (one connection, used under the store's lock).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..pictures.span import PictureKey, PictureSpan
from ..platform.files import sqlite_durable
from .keys import KEY_BYTES, BlockKey
from .layout import KVLayout

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions(
    id TEXT PRIMARY KEY,
    namespace BLOB NOT NULL,      -- namespace digest (model fingerprint + block size + format)
    block_tokens INTEGER NOT NULL,
    block_keys BLOB NOT NULL,     -- ordered 32-byte keys of the full blocks, concatenated
    tail_key BLOB,                -- blob of the tokens past the last full block, or NULL
    tail_tokens INTEGER NOT NULL,
    n_tokens INTEGER NOT NULL,
    pictures TEXT NOT NULL,       -- JSON [[start, end, key_hex], ...]
    layout TEXT NOT NULL,         -- JSON KVLayout
    state TEXT NOT NULL,          -- JSON dict the engine needs at restore (e.g. rope_deltas)
    bytes INTEGER NOT NULL,       -- total size of the blobs the row references
    last_used REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_lru ON sessions(last_used);
CREATE TABLE IF NOT EXISTS blobs(
    key BLOB PRIMARY KEY,
    size INTEGER NOT NULL,
    refcount INTEGER NOT NULL,
    last_use REAL NOT NULL,
    kind INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS blobs_unreferenced ON blobs(refcount) WHERE refcount <= 0;
"""


# ------------------------------------------------------------------ state codec


def encode_state(state: dict | None) -> str:
    """JSON with small tensors (e.g. Qwen-VL rope_deltas) encoded as dtype/shape/data."""

    def enc(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu()
            return {
                "__tensor__": str(t.dtype).removeprefix("torch."),
                "shape": list(t.shape),
                "data": t.reshape(-1).tolist(),
            }
        if isinstance(x, dict):
            return {str(k): enc(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [enc(v) for v in x]
        if isinstance(x, bytes):
            return {"__bytes__": x.hex()}
        return x

    return json.dumps(enc(state or {}), separators=(",", ":"))


def decode_state(text: str) -> dict:
    def dec(x: Any) -> Any:
        if isinstance(x, dict):
            if "__tensor__" in x:
                return torch.tensor(x["data"], dtype=getattr(torch, x["__tensor__"])).reshape(x["shape"])
            if "__bytes__" in x and len(x) == 1:
                return bytes.fromhex(x["__bytes__"])
            return {k: dec(v) for k, v in x.items()}
        if isinstance(x, list):
            return [dec(v) for v in x]
        return x

    return dec(json.loads(text))


# ------------------------------------------------------------------ rows


@dataclass
class SessionRow:
    id: str
    namespace: bytes
    block_tokens: int
    block_keys: list[BlockKey]
    tail_key: BlockKey | None
    tail_tokens: int
    n_tokens: int
    pictures: tuple[PictureSpan, ...]
    layout: KVLayout
    state_json: str = "{}"
    bytes: int = 0
    last_used: float = field(default_factory=time.time)

    def keys(self) -> list[BlockKey]:
        return self.block_keys + ([self.tail_key] if self.tail_key else [])

    @property
    def state(self) -> dict:
        return decode_state(self.state_json)


def _split_keys(blob: bytes) -> list[BlockKey]:
    return [BlockKey(bytes(blob[i : i + KEY_BYTES])) for i in range(0, len(blob), KEY_BYTES)]


def _span_json(p: PictureSpan) -> list:
    return [p.start, p.end, p.key.hex()]


def _span_from_json(item: list) -> PictureSpan:
    return PictureSpan(int(item[0]), int(item[1]), PictureKey(bytes.fromhex(item[2])))


def _row(r: tuple) -> SessionRow:
    return SessionRow(
        id=r[0],
        namespace=bytes(r[1]),
        block_tokens=r[2],
        block_keys=_split_keys(r[3]),
        tail_key=BlockKey(bytes(r[4])) if r[4] is not None else None,
        tail_tokens=r[5],
        n_tokens=r[6],
        pictures=tuple(_span_from_json(p) for p in json.loads(r[7])),
        layout=KVLayout.from_json(json.loads(r[8])),
        state_json=r[9],
        bytes=r[10],
        last_used=r[11],
    )


_SESSION_COLS = (
    "id, namespace, block_tokens, block_keys, tail_key, tail_tokens, n_tokens, "
    "pictures, layout, state, bytes, last_used"
)


class Manifest:
    def __init__(self, path: str):
        # autocommit mode: transactions are explicit BEGIN IMMEDIATE ... COMMIT
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        self.db.execute("PRAGMA journal_mode=WAL")
        # FULL: a committed row survives power loss, so blobs released by it are truly unneeded
        self.db.execute("PRAGMA synchronous=FULL")
        sqlite_durable(self.db)
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, SCHEMA_VERSION):
            raise sqlite3.DatabaseError(f"manifest schema {version}, expected {SCHEMA_VERSION}")
        self.db.executescript(_SCHEMA)
        self.db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def close(self) -> None:
        self.db.close()

    # -- reads
    def session(self, sid: str) -> SessionRow | None:
        r = self.db.execute(f"SELECT {_SESSION_COLS} FROM sessions WHERE id=?", (sid,)).fetchone()
        return _row(r) if r else None

    def sessions(self) -> list[SessionRow]:
        rows = self.db.execute(f"SELECT {_SESSION_COLS} FROM sessions ORDER BY last_used").fetchall()
        return [_row(r) for r in rows]

    def blob_sizes(self, keys: Iterable[bytes]) -> dict[bytes, int]:
        keys = list(dict.fromkeys(keys))
        out: dict[bytes, int] = {}
        for i in range(0, len(keys), 500):  # stay under SQLite's bound-parameter limit
            chunk = keys[i : i + 500]
            q = f"SELECT key, size FROM blobs WHERE key IN ({','.join('?' * len(chunk))})"
            out.update((bytes(k), s) for k, s in self.db.execute(q, chunk))
        return out

    def all_blobs(self) -> dict[bytes, tuple[int, int]]:
        return {bytes(k): (s, rc) for k, s, rc in self.db.execute("SELECT key, size, refcount FROM blobs")}

    def totals(self) -> tuple[int, int, int]:
        n, total = self.db.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM blobs").fetchone()
        (ns,) = self.db.execute("SELECT COUNT(*) FROM sessions").fetchone()
        return n, total, ns

    def lru_sessions(self) -> list[tuple[str, float]]:
        return list(self.db.execute("SELECT id, last_used FROM sessions ORDER BY last_used, id"))

    def unreferenced(self) -> list[tuple[bytes, int]]:
        return [(bytes(k), s) for k, s in self.db.execute("SELECT key, size FROM blobs WHERE refcount <= 0")]

    # -- writes (each one transaction)
    def install(
        self,
        row: SessionRow,
        written: Iterable[tuple[bytes, int, int]],
        referenced: Iterable[tuple[bytes, int, int]],
        keep: Callable[[bytes], bool] = lambda k: False,
    ) -> list[BlockKey]:
        """Upsert blob rows, swap the session row, and move refcounts from old keys to new keys,
        atomically. `written`/`referenced`: (key, size, kind). Blob rows the old row alone held
        are deleted in the same transaction (one commit, one fsync) unless keep(key); returns
        their keys: the caller unlinks those files after the commit."""
        now = row.last_used
        with self._txn():
            old = self.session(row.id)
            for key, size, kind in written:
                self.db.execute(
                    "INSERT INTO blobs(key, size, refcount, last_use, kind) VALUES(?,?,0,?,?) "
                    "ON CONFLICT(key) DO UPDATE SET size=excluded.size, last_use=excluded.last_use",
                    (key, size, now, kind),
                )
            for key, size, kind in referenced:
                self.db.execute(
                    "INSERT INTO blobs(key, size, refcount, last_use, kind) VALUES(?,?,0,?,?) "
                    "ON CONFLICT(key) DO UPDATE SET last_use=excluded.last_use",
                    (key, size, now, kind),
                )
            delta = Counter(row.keys())
            delta.subtract(old.keys() if old else [])
            freed = []
            for key, d in delta.items():
                if d:
                    self.db.execute("UPDATE blobs SET refcount=refcount+? WHERE key=?", (d, key))
                if d < 0 and not keep(key):
                    rc = self.db.execute("SELECT refcount FROM blobs WHERE key=?", (key,)).fetchone()
                    if rc is not None and rc[0] <= 0:
                        self.db.execute("DELETE FROM blobs WHERE key=?", (key,))
                        freed.append(key)
            self.db.execute(
                f"INSERT OR REPLACE INTO sessions({_SESSION_COLS}) VALUES(?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    row.id,
                    row.namespace,
                    row.block_tokens,
                    b"".join(row.block_keys),
                    row.tail_key,
                    row.tail_tokens,
                    row.n_tokens,
                    json.dumps([_span_json(p) for p in row.pictures]),
                    json.dumps(row.layout.to_json()),
                    row.state_json,
                    row.bytes,
                    row.last_used,
                ),
            )
        return freed

    def drop_session(self, sid: str) -> SessionRow | None:
        with self._txn():
            old = self.session(sid)
            if old is None:
                return None
            for key, d in Counter(old.keys()).items():
                self.db.execute("UPDATE blobs SET refcount=refcount-? WHERE key=?", (d, key))
            self.db.execute("DELETE FROM sessions WHERE id=?", (sid,))
        return old

    def delete_blobs(self, keys: list[bytes]) -> None:
        with self._txn():
            self.db.executemany("DELETE FROM blobs WHERE key=? AND refcount <= 0", [(k,) for k in keys])

    def touch(self, sid: str, when: float) -> None:
        self.db.execute("UPDATE sessions SET last_used=? WHERE id=?", (when, sid))

    def reconcile(self, files: dict[bytes, int]) -> dict[str, Any]:
        """Startup: recount refcounts from session rows and align blob rows with the files present
        (`files`: key -> size from a directory listing; payloads are never read)."""
        report: dict[str, Any] = {"missing_rows": 0, "recounted": 0, "unreferenced": [], "size_mismatch": []}
        with self._txn():
            refs: Counter = Counter()
            for row in self.sessions():
                refs.update(row.keys())
            rows = self.all_blobs()
            now = time.time()
            for key, n in refs.items():
                if key not in rows:
                    if key in files:  # referenced file with a lost row: adopt it
                        self.db.execute("INSERT INTO blobs VALUES(?,?,?,?,0)", (key, files[key], n, now))
                        rows[key] = (files[key], n)
                    else:
                        report["missing_rows"] += 1
            for key, (size, rc) in rows.items():
                want = refs.get(key, 0)
                if rc != want:
                    self.db.execute("UPDATE blobs SET refcount=? WHERE key=?", (want, key))
                    report["recounted"] += 1
                if want == 0:
                    report["unreferenced"].append(key)
                elif key not in files:
                    report["missing_rows"] += 1  # kept: restore stops there, next spill rewrites it
                elif files[key] != size:
                    report["size_mismatch"].append(key)  # torn or truncated file; caller unlinks it
        return report

    def _txn(self):
        return _Txn(self.db)


class _Txn:
    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self):
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.db.execute("COMMIT")
        else:
            self.db.execute("ROLLBACK")
        return False
