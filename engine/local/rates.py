"""Rates measured on this machine, kept as running averages across restarts: how fast the SSD store
gives KV back (MiB/s, per device it is restored to) and how fast the loaded model reads a prompt
(tokens/s, per model fingerprint and device). The window's resume estimates ("resumes in ~0.4 s
instead of ~7 min") are these rates applied to a chat's bytes and tokens; nothing is a constant.

The average is a decayed sum of amounts over a decayed sum of seconds, so a long restore or
prefill weighs more than a short one (whose fixed costs would otherwise skew the rate), and a
change of machine or disk shows within a few measurements. The file is the engine's own
(data folder); a damaged or hostile one is ignored and rebuilt.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

from ..platform.files import atomic_write
from ..protocol.events import MeasuredRates

log = logging.getLogger(__name__)

RATES_FILE = "measured-rates.json"
KEEP = 0.7  # the past's weight in the running average, per new measurement
MAX_ENTRIES = 64  # models and devices remembered per kind (a file cannot grow without end)
MiB = 1 << 20


@dataclass
class RunningRate:
    amount: float = 0.0  # decayed sum of MiB (restore) or tokens (prefill)
    seconds: float = 0.0  # decayed sum of the seconds they took

    def add(self, amount: float, seconds: float) -> None:
        self.amount = KEEP * self.amount + amount
        self.seconds = KEEP * self.seconds + seconds

    @property
    def rate(self) -> float | None:
        return self.amount / self.seconds if self.seconds > 0 and self.amount > 0 else None


def _valid(pair) -> bool:
    return (
        isinstance(pair, list)
        and len(pair) == 2
        and all(isinstance(x, (int, float)) and math.isfinite(x) and 0 < x < 1e15 for x in pair)
    )


class RateBook:
    """The running rates for one loaded model on one device; `path` is shared by all of them."""

    def __init__(self, path: Path, model_key: str, device: str):
        self.path = Path(path)
        self.restore_key = device
        self.prefill_key = f"{model_key}@{device}"
        self._file: dict[str, dict[str, list[float]]] = {"restore": {}, "prefill": {}}
        self._load()
        self.restore = self._entry("restore", self.restore_key)
        self.prefill = self._entry("prefill", self.prefill_key)

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text("utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("measured rates in %s are unreadable (%s); measuring afresh", self.path, exc)
            return
        if not isinstance(data, dict):
            return
        for kind in ("restore", "prefill"):
            entries = data.get(kind)
            if isinstance(entries, dict):
                self._file[kind] = {
                    k: v
                    for k, v in list(entries.items())[-MAX_ENTRIES:]
                    if isinstance(k, str) and len(k) < 512 and _valid(v)
                }

    def _entry(self, kind: str, key: str) -> RunningRate:
        pair = self._file[kind].get(key)
        return RunningRate(*pair) if pair else RunningRate()

    def record_restore(self, nbytes: int, seconds: float) -> None:
        """A restore read `nbytes` of KV back into memory in `seconds`."""
        if nbytes > 0 and seconds > 0:
            self.restore.add(nbytes / MiB, seconds)
            self._save("restore", self.restore_key, self.restore)

    def record_prefill(self, tokens: int, seconds: float) -> None:
        """The model read `tokens` prompt tokens in `seconds`."""
        if tokens > 0 and seconds > 0:
            self.prefill.add(tokens, seconds)
            self._save("prefill", self.prefill_key, self.prefill)

    def rates(self) -> MeasuredRates:
        return MeasuredRates(restore_mib_s=self.restore.rate, prefill_tok_s=self.prefill.rate)

    def _save(self, kind: str, key: str, value: RunningRate) -> None:
        entries = self._file[kind]
        entries.pop(key, None)  # the latest used goes last: the oldest are dropped first
        entries[key] = [value.amount, value.seconds]
        while len(entries) > MAX_ENTRIES:
            entries.pop(next(iter(entries)))
        try:  # not durable: a lost update costs one measurement, an fsync would cost every turn
            atomic_write(self.path, json.dumps(self._file).encode(), durable=False)
        except OSError as exc:
            log.warning("cannot keep measured rates in %s: %s", self.path, exc)
