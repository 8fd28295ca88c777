"""SSD KV block store: content-keyed blocks of a session's KV cache, spilled incrementally and
restored after a restart. Never imports Qt.

One-way chain, each module using only the ones before it:
  keys, blob, layout, manifest, restore (planning)   pure pieces: keys, file format, cache check, SQLite rows
  writer, sweep, reader                              writer thread + buffers, the folder on disk, blob reads
  index                                              StoreIndex: manifest, pins, counters, lock; eviction,
                                                     job commit, sweep, restore pinning
  spill_job                                          SpillJob: copies and writes, given index + writer + pool
  session_restore                                    SessionRestoreJob: one session's own KV back, a blob a step
  versions                                           a conversation's version rows: names, best match
  store                                              KVStore: the thin facade the engine uses
"""

from ..pictures.span import PictureSpan
from .errors import KVStoreError, StoreUnavailable, UnsupportedCache
from .keys import BlockKey, block_keys, namespace_digest
from .layout import KVLayout, model_refusal
from .restore import RestoreResult
from .session_restore import SessionRestore, SessionRestoreJob
from .spill_job import SpillJob
from .spill_records import SpillResult
from .store import KVStore, StoredSession
from .versions import RowMatch, best_of, is_version

__all__ = [
    "KVStore",
    "StoredSession",
    "SessionRestore",
    "SessionRestoreJob",
    "SpillJob",
    "SpillResult",
    "RestoreResult",
    "KVStoreError",
    "StoreUnavailable",
    "UnsupportedCache",
    "PictureSpan",
    "BlockKey",
    "KVLayout",
    "block_keys",
    "namespace_digest",
    "model_refusal",
    "RowMatch",
    "best_of",
    "is_version",
]
