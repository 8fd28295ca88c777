"""Download progress as plain numbers (bytes, speed, time left) for any display: a tqdm bar in
the terminal, a progress bar in the window."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Progress:
    done_bytes: int
    total_bytes: int
    speed_bps: float  # bytes per second over the last few seconds
    eta_s: float | None  # None until a speed is known
    file: str  # the file being fetched now
    resumed_bytes: int = 0  # already on disk from an earlier, interrupted pull

    @property
    def fraction(self) -> float:
        return self.done_bytes / self.total_bytes if self.total_bytes else 1.0


ProgressCallback = Callable[[Progress], None]


class ProgressMeter:
    """Counts bytes and calls `callback` at most every `interval` seconds (and on `finish`)."""

    def __init__(
        self,
        total: int,
        callback: ProgressCallback | None,
        interval: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total, self.callback, self.interval, self.clock = total, callback, interval, clock
        self.done = 0
        self.resumed = 0
        self.file = ""
        self._window: list[tuple[float, int]] = [(clock(), 0)]  # (time, bytes moved) samples
        self._last_emit = 0.0
        self._emitted_file = ""

    def waiting(self) -> None:
        """Said once when the current file must wait for another pull that is fetching it."""
        self._emit(force=True)
        self._emitted_file = ""  # its first bytes (if any come) are said too

    def resumed_from_disk(self, n: int) -> None:
        self.done += n
        self.resumed += n
        self._emit(force=True)

    def add(self, n: int) -> None:
        self.done += n
        self._emit()

    def rollback(self, n: int) -> None:
        """Bytes counted but thrown away (a server that ignored Range, a checksum failure)."""
        self.done -= n
        self._emit(force=True)

    def finish(self) -> None:
        self._emit(force=True)

    def speed(self) -> float:
        now = self.clock()
        moved = self.done - self.resumed
        self._window.append((now, moved))
        while len(self._window) > 2 and now - self._window[0][0] > 3.0:
            self._window.pop(0)
        t0, b0 = self._window[0]
        return (moved - b0) / (now - t0) if now > t0 else 0.0

    def snapshot(self) -> Progress:
        speed = self.speed()
        left = max(self.total - self.done, 0)
        eta = left / speed if speed > 0 else None
        return Progress(self.done, self.total, speed, eta, self.file, self.resumed)

    def _emit(self, force: bool = False) -> None:
        if self.callback is None:
            return
        now = self.clock()
        if force or now - self._last_emit >= self.interval or self.file != self._emitted_file:
            self._last_emit, self._emitted_file = now, self.file
            self.callback(self.snapshot())


class TqdmProgress:
    """A ProgressCallback drawing one tqdm bar (bytes, speed, time left) on stderr."""

    def __init__(self, desc: str):
        from tqdm import tqdm

        self.bar = tqdm(total=0, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, leave=True)

    def __call__(self, p: Progress) -> None:
        if self.bar.total != p.total_bytes:
            self.bar.total = p.total_bytes
        self.bar.update(p.done_bytes - self.bar.n)

    def close(self) -> None:
        self.bar.close()
