"""RAM tier of the image cache: least-recently-used by entries and bytes."""

from __future__ import annotations

import threading
from collections import OrderedDict

from ..pictures.span import PictureKey
from .entry import PictureEntry


class RamImageCache:
    def __init__(self, max_entries: int = 64, max_bytes: int = 1 << 30):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._items: OrderedDict[bytes, PictureEntry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # the gate reads from turns; the panel reads sizes
        self.evictions = 0

    def get(self, key: PictureKey) -> PictureEntry | None:
        with self._lock:
            entry = self._items.get(key)
            if entry is not None:
                self._items.move_to_end(key)  # a hit is a use: LRU, not insertion order
            return entry

    def put(self, entry: PictureEntry) -> list[PictureEntry]:
        """Insert (or refresh) an entry; returns what was evicted to make room."""
        evicted = []
        with self._lock:
            old = self._items.pop(entry.key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._items[entry.key] = entry
            self._bytes += entry.nbytes
            while self._items and (len(self._items) > self.max_entries or self._bytes > self.max_bytes):
                if len(self._items) == 1:
                    break  # one picture larger than the budget still serves its own turn
                _, gone = self._items.popitem(last=False)
                self._bytes -= gone.nbytes
                self.evictions += 1
                evicted.append(gone)
        return evicted

    def __contains__(self, key: PictureKey) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def resize(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        with self._lock:
            while len(self._items) > max(1, max_entries) or (self._bytes > max_bytes and len(self._items) > 1):
                _, gone = self._items.popitem(last=False)
                self._bytes -= gone.nbytes
                self.evictions += 1
