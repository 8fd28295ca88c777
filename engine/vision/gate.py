"""The image-cache gate: pictures found in the cache never reach the encoder.

`lookup` turns a PictureRef into an entry (RAM hit, disk hit — keyed by the ref's digest, the
file is not opened — or a miss that reads the file, checks it still matches the digest and
decodes it); `ensure_features` encodes only the entries that still lack features, and only that path
loads the encoder or restarts its idle clock. An all-hit turn never touches the residency.
Before `ensure_features`, the turn asks `load_bytes` what loading the encoder would take and makes
room for it itself (engine/local/pipeline.py): the gate calls nothing outside this room but `emit`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..pictures.ref import PictureRef
from ..pictures.span import PictureKey
from ..pictures.video import as_clips
from ..protocol.events import EncoderState, EncoderStatus, Event, PicturePlace
from .disk_cache import DiskImageCache
from .encode import encode_entry
from .entry import PictureEntry, encoder_identity, picture_key, video_identity
from .pictures import prepare_entry
from .ram_cache import RamImageCache
from .residency import EncoderResidency

log = logging.getLogger(__name__)


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


class PictureGate:
    def __init__(self, loaded, settings, cache_dir: Path | None = None, emit: Callable[[Event], None] | None = None):
        self.loaded = loaded
        self.identity = encoder_identity(loaded)
        self.video_identity = video_identity(loaded, self.identity)
        self.ram = RamImageCache(settings.image_cache_entries, settings.image_cache_ram_bytes)
        self.disk = DiskImageCache(cache_dir, settings.image_cache_disk_bytes) if cache_dir else None
        self.residency = EncoderResidency(loaded, settings.elastic, settings.elastic_idle_s)
        self.emit = emit or (lambda event: None)
        # disk writes leave the owner thread so a slow disk never stalls a turn
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parley-image-cache")
        self.counters = {"hits": 0, "ram_hits": 0, "disk_hits": 0, "misses": 0, "encodes": 0}

    @property
    def disk_error(self) -> str | None:
        return None if self.disk is None else self.disk.error

    # ------------------------------------------------------------ the encoder, as others see it

    @property
    def encoder_state(self) -> EncoderStatus:
        return self.residency.state

    @property
    def elastic_refused(self) -> str | None:
        """Why this model's encoder can never be released (None when it can)."""
        return self.residency.disabled_reason

    def encoder_idle_left(self) -> float | None:
        return self.residency.idle_left()

    def cache_bytes(self) -> tuple[int, int]:
        """Bytes of cached features (RAM, disk)."""
        return self.ram.nbytes, self.disk.nbytes if self.disk is not None else 0

    def apply_settings(self, settings) -> None:
        """New settings at run time: cache sizes, idle time and elastic residency. Turning
        elastic off loads the encoder now (non-elastic means always resident); turning it on
        builds the map its weights are read back with before they can be released."""
        self.ram.resize(settings.image_cache_entries, settings.image_cache_ram_bytes)
        r = self.residency
        r.idle_s = settings.elastic_idle_s
        if r.set_elastic(settings.elastic) or r.disabled_reason is not None:
            return
        if r.state != EncoderStatus.RESIDENT:
            self._load_encoder()

    def why_not_unloaded(self) -> str:
        r = self.residency
        return r.disabled_reason or ("elastic mode is off" if not r.elastic else f"it is {r.state}")

    def key_of(self, ref: PictureRef) -> PictureKey:
        """The cache key: the ref's digest (no read) and the encoder's identity (a clip's: with the
        video processor's config)."""
        return picture_key(ref.digest, self.video_identity if ref.modality == "video" else self.identity)

    def lookup(self, ref: PictureRef, stats: GateTurnStats) -> PictureEntry:
        return self.cached(ref, stats) or self.prepare(ref, stats)

    def cached(self, ref: PictureRef, stats: GateTurnStats) -> PictureEntry | None:
        """The picture's entry from the RAM or disk cache (counted as a hit), else None."""
        key = self.key_of(ref)
        entry = self.ram.get(key)
        tier = "ram_hits"
        if entry is None and self.disk is not None:
            entry = self.disk.get(key)
            tier = "disk_hits"
            if entry is not None and self.ram.max_entries > 0:
                self.ram.put(entry)
        if entry is not None:
            stats.hits += 1
            setattr(stats, tier, getattr(stats, tier) + 1)
            self.counters["hits"] += 1
            self.counters[tier] += 1
            return entry
        return None

    def prepare(self, ref: PictureRef, stats: GateTurnStats) -> PictureEntry:
        """A miss: read (render, decode) and preprocess the picture, to be encoded."""
        stats.misses += 1
        self.counters["misses"] += 1
        # the file is read only now; one changed since it was attached fails this turn alone
        return prepare_entry(self.loaded, self.key_of(ref), ref)

    def place_of(self, ref: PictureRef) -> PicturePlace:
        """Where this picture's features are, asked without touching the caches' order or the file."""
        key = self.key_of(ref)
        if key in self.ram:
            return PicturePlace.RAM
        if self.disk is not None and self.disk.contains(key):
            return PicturePlace.DISK
        return PicturePlace.NOT_CACHED

    def places(self, refs) -> dict[str, PicturePlace]:
        """Where each attached picture's features are, by its digest: a frame of a clip the model
        takes as one video (Family.native_video) is where its clip is."""
        out = {}
        for r in self.as_model_takes(refs):
            place = self.place_of(r)
            for member in r.members:
                out[member.digest] = place
        return out

    def as_model_takes(self, refs) -> list[PictureRef]:
        return as_clips(refs) if self.loaded.family.native_video else list(refs)

    def warm_for(self, refs) -> bool:
        """A picture of a message being written is not cached and the encoder is away: loading it
        now, while the person types, takes that wait out of the turn."""
        return (
            self.residency.state == EncoderStatus.UNLOADED
            and self.elastic_refused is None
            and any(self.place_of(r) == PicturePlace.NOT_CACHED for r in self.as_model_takes(refs))
        )

    def encoder_load_bytes(self) -> int:
        """Device bytes loading the encoder takes now (0 when it is resident)."""
        return 0 if self.residency.state == EncoderStatus.RESIDENT else self.residency.weight_bytes()

    def warm_up(self) -> None:
        """Load the encoder ahead of the turn that needs it; its idle clock starts now, so an
        abandoned draft gives the memory back after elastic_idle_s."""
        if self.residency.state != EncoderStatus.RESIDENT:
            self.emit_state(EncoderStatus.LOADING)
            try:
                self.residency.ensure_loaded()
                self.residency.touch()
            finally:
                self.emit_state()

    def load_bytes(self, entries: list[PictureEntry]) -> int:
        """Device bytes encoding `entries` would load (the encoder's weights), 0 when it need not load."""
        if self.residency.state == EncoderStatus.RESIDENT or all(e.features is not None for e in entries):
            return 0
        return self.residency.weight_bytes()

    def ensure_features(self, entries: list[PictureEntry], stats: GateTurnStats) -> None:
        """Encode the entries lacking features; others never touch the encoder or its clock."""
        todo = [e for e in entries if e.features is None]
        if not todo:
            return
        if self.residency.state != EncoderStatus.RESIDENT:
            self._load_encoder()
            stats.encoder_loads += 1
            stats.load_s += self.residency.last_load_s
        for e in todo:
            t0 = time.perf_counter()
            e.features = encode_entry(self.loaded, e)
            stats.encode_s += time.perf_counter() - t0
            stats.encoded += 1
            self.counters["encodes"] += 1
            e.encoder_inputs = None  # pixels are not kept: the features are what is reused
            self._store(e)
        self.residency.touch()

    def _load_encoder(self) -> None:
        self.emit_state(EncoderStatus.LOADING)
        try:
            self.residency.ensure_loaded()
        finally:
            self.emit_state(self.residency.state)

    def emit_state(self, state: EncoderStatus | None = None) -> None:
        """Say the encoder's state (now, unless a state about to be entered is named)."""
        self.emit(EncoderState(state or self.residency.state, self.encoder_idle_left()))

    def _store(self, entry: PictureEntry) -> None:
        if self.ram.max_entries > 0:
            self.ram.put(entry)
        if self.disk is not None and self.disk.available:
            self._writer.submit(self.disk.put, entry)

    def unload_if_idle(self) -> bool:
        if self.residency.due_for_unload():
            return self.unload()
        return False

    def unload(self) -> bool:
        done = self.residency.unload()
        if done:
            self.emit_state(EncoderStatus.UNLOADED)
        return done

    def stats_counters(self) -> dict:
        r = self.residency
        out = dict(self.counters)
        out.update(
            {
                "encoder_loads": r.loads,
                "encoder_unloads": r.unloads,
                "image_cache_evictions": self.ram.evictions,
                "image_cache_ram_entries": len(self.ram),
                "image_cache_disk_entries": len(self.disk) if self.disk is not None else 0,
                "image_cache_damaged": self.disk.damaged if self.disk is not None else 0,
            }
        )
        return out

    def close(self) -> None:
        self._writer.shutdown(wait=True)  # pending features reach the disk before exit
        if self.disk is not None:
            self.disk.close()
