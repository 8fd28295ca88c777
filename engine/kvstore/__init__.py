"""SSD KV block store: content-keyed blocks of a session's KV cache, spilled incrementally and
restored after a restart. See store.KVStore. Never imports Qt."""
from .errors import KVStoreError, StoreUnavailable, UnsupportedCache
from .keys import PictureSpan, block_keys, namespace_digest
from .layout import KVLayout, model_refusal
from .restore import RestoreResult
from .spill import SpillJob, SpillResult
from .store import KVStore

__all__ = ["KVStore", "SpillJob", "SpillResult", "RestoreResult", "KVStoreError", "StoreUnavailable", "UnsupportedCache",
           "PictureSpan", "KVLayout", "block_keys", "namespace_digest", "model_refusal"]
