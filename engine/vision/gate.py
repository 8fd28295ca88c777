"""The image-cache gate: pictures found in the cache never reach the encoder.

`lookup` turns a picture path into an entry (a cache hit needs no decode); `ensure_features`
encodes only the entries that still lack features, and only those wake the encoder.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from .encode import encode_entry
from .entry import PictureEntry, encoder_identity, picture_key
from .pictures import prepare_entry, read_bytes
from .ram_cache import RamImageCache


@dataclass
class GateTurnStats:
    hits: int = 0
    ram_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    encoded: int = 0
    encode_s: float = 0.0
    encoder_loads: int = 0
    load_s: float = 0.0
    keys: list = field(default_factory=list)


class PictureGate:
    def __init__(self, loaded, settings):
        self.loaded = loaded
        self.identity = encoder_identity(loaded)
        self.ram = RamImageCache(settings.image_cache_entries, settings.image_cache_ram_bytes)
        self.counters = {"hits": 0, "ram_hits": 0, "disk_hits": 0, "misses": 0, "encodes": 0}

    def lookup(self, path: str, stats: GateTurnStats) -> PictureEntry:
        data = read_bytes(path)
        key = picture_key(data, self.identity)
        entry = self.ram.get(key)
        if entry is not None:
            stats.hits += 1
            stats.ram_hits += 1
            self.counters["hits"] += 1
            self.counters["ram_hits"] += 1
            return entry
        stats.misses += 1
        self.counters["misses"] += 1
        return prepare_entry(self.loaded, key, data, Path(path).name)

    def ensure_features(self, entries: list[PictureEntry], stats: GateTurnStats) -> None:
        """Encode the entries that lack features; entries with features never touch the encoder."""
        todo = [e for e in entries if e.features is None]
        for e in todo:
            t0 = time.perf_counter()
            e.features = encode_entry(self.loaded, e)
            stats.encode_s += time.perf_counter() - t0
            stats.encoded += 1
            self.counters["encodes"] += 1
            e.encoder_inputs = None  # pixels are not kept: the features are what is reused
            self.ram.put(e)

    def remember(self, entries: list[PictureEntry]) -> None:
        """Entries prepared this turn whose tokens were already in the KV prefix: keep their
        expansion so the next turn needs no decode (features come when first needed)."""
        for e in entries:
            if e.features is not None and e.key not in self.ram:
                self.ram.put(e)
