"""Counters of API use that the window's Memory dock shows."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class ApiActivity:
    """Counters the window reads (or receives through `on_change`, called from HTTP threads)."""

    def __init__(self, on_change: Callable[[dict], None] | None = None):
        self._lock = threading.Lock()
        self.on_change = on_change
        self.requests = 0  # chat completions received
        self.active = 0  # chat completions in progress (queued or generating)
        self.errors = 0  # requests answered with an error status
        self.disconnects = 0  # clients that went away mid-reply (their generation was stopped)
        self.last_client: str | None = None
        self.last_request_at: float | None = None  # time.time()

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "requests": self.requests,
                "active": self.active,
                "errors": self.errors,
                "disconnects": self.disconnects,
                "last_client": self.last_client,
                "last_request_at": self.last_request_at,
            }

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change(self.snapshot())
            except Exception:
                log.exception("API activity callback failed")

    def begin(self, client: str) -> None:
        with self._lock:
            self.requests += 1
            self.active += 1
            self.last_client = client
            self.last_request_at = time.time()
        self._changed()

    def end(self) -> None:
        with self._lock:
            self.active -= 1
        self._changed()

    def count(self, field: str) -> None:
        with self._lock:
            setattr(self, field, getattr(self, field) + 1)
        self._changed()
