"""What a spill plans and what it reports: records both the spill job and the store index use.
A leaf, so the index (which commits a job's plan) need not import the job that imports it."""

from __future__ import annotations

from dataclasses import dataclass

from .keys import BlockKey


@dataclass
class SpillResult:
    ok: bool
    session_id: str
    n_tokens: int = 0
    error: str | None = None
    blocks_written: int = 0  # full blocks written (the tail is counted in tail_written)
    tail_written: int = 0
    reused_blobs: int = 0  # blocks/tail referenced from disk: not copied, not written
    reused_bytes: int = 0
    missing_blobs: int = 0  # named by the manifest but gone from disk: rewritten here
    bytes_written: int = 0
    evicted_sessions: int = 0
    copy_seconds: float = 0.0  # owner-thread time spent in device->host copies
    seconds: float = 0.0  # begin_spill -> manifest commit


@dataclass
class BlobPlan:
    key: BlockKey
    kind: int
    start: int
    end: int
    size: int
    path: str
    write: bool = True

    @property
    def n(self) -> int:
        return self.end - self.start
