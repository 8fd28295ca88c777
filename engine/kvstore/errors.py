"""Errors raised by the KV block store."""

from __future__ import annotations


class KVStoreError(Exception):
    """Base class: something about the store itself (directory, manifest, lock)."""


class StoreUnavailable(KVStoreError):
    """The store's files are intact but cannot be used now: the disk is full, read-only or failing.

    Nothing was set aside or deleted; opening the store again once the cause is gone finds every
    conversation it held. `reason` is one line for the log and the memory dock."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class UnsupportedCache(KVStoreError):
    """The cache holds state the store cannot spill exactly (sliding window, recurrent, quantized...).

    Raised before anything is copied or written; the caller keeps its cache hot.
    `layer_index` and `layer_type` name the first offending layer when there is one.
    """

    def __init__(self, reason: str, layer_index: int | None = None, layer_type: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.layer_index = layer_index
        self.layer_type = layer_type


class BadBlob(Exception):
    """A blob failed verification (checksum, header, tokens, size). Internal: restore counts it."""


class MissingBlob(Exception):
    """A blob the manifest names is not on disk. Internal: restore counts it."""
