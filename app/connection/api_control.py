"""The OpenAI-compatible API server inside the app: started, stopped and restarted from Settings,
on the window's own Engine (the same queue, caches and model as the chat).

Everything here runs on the UI thread except `_on_activity`, which the server calls from its HTTP
threads: it only posts a Wake (app.worker: at most one call pending at a time); the UI thread then
reads a fresh snapshot of the counters, so widgets are only ever touched on the UI thread.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal

from engine.api import ApiConfigError

from ..settings import FAILED, LISTENING, OFF, ApiConfig, config_problem
from ..worker import Wake

if TYPE_CHECKING:
    from engine.api import ApiServer

log = logging.getLogger(__name__)


class ApiControl(QObject):
    """Owns the ApiServer (or none). `apply(cfg)` makes the running server match `cfg`."""

    stateChanged = Signal(str, str)  # OFF | LISTENING | FAILED, and the URL or the error
    activityChanged = Signal(object)  # ApiActivity.snapshot() dict, on the UI thread

    def __init__(self, engine, data_dir: Path | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self.engine = engine
        self.data_dir = data_dir
        self.server: ApiServer | None = None
        self.config: ApiConfig | None = None  # what the running server was started with
        self.state, self.detail = OFF, ""
        self._gen = 0  # which server's activity is current (an old one's late callbacks are dropped)
        self._closed = False
        self._wake = Wake(self._on_wake, self)

    @property
    def url(self) -> str | None:
        return self.server.url if self.server is not None else None

    def apply(self, cfg: ApiConfig) -> str | None:
        """Start, stop or restart the server to match `cfg`. Returns None, or why it is not serving
        as asked (the server then stays off, or on its previous settings when it was running)."""
        if self._closed:
            return None
        if not cfg.enabled:
            self._stop_server()
            self._set_state(OFF, "")
            return None
        if self.server is not None and cfg == self.config:
            return None  # already serving exactly this
        problem = config_problem(cfg)
        if problem is not None:
            if self.server is not None:
                return f"{problem} The API server stays on {self.server.url}."
            self._fail(problem)
            return problem
        previous = self.config if self.server is not None else None
        self._stop_server()
        try:
            self._start_server(cfg)
        except (ApiConfigError, OSError) as exc:
            message = str(exc)
            if previous is not None:
                try:
                    restarted = self._start_server(previous)
                    message += f" The API server stays on {restarted.url}."
                except (ApiConfigError, OSError) as again:
                    log.warning("API server could not be restarted on its previous settings: %s", again)
            if self.server is None:
                self._fail(message)
            return message
        return None

    def stop(self) -> None:
        """Stop serving for good (the window is closing): before the engine shuts down."""
        self._closed = True
        self._stop_server()
        self.state, self.detail = OFF, ""

    # ------------------------------------------------------------ internals

    def _start_server(self, cfg: ApiConfig) -> ApiServer:
        self._gen += 1
        gen = self._gen
        from engine.api import ApiServer  # its web stack loads only when a server is wanted

        server = ApiServer(
            self.engine,
            cfg.host,
            cfg.port,
            token=cfg.token or None,
            data_dir=self.data_dir,
            on_activity=lambda snap: self._on_activity(gen, snap),
        )
        server.start()
        self.server, self.config = server, cfg
        self._set_state(LISTENING, server.url)
        self.activityChanged.emit(server.activity.snapshot())
        return server

    def _stop_server(self) -> None:
        server, self.server, self.config = self.server, None, None
        self._gen += 1
        if server is not None:
            server.stop()

    def _fail(self, message: str) -> None:
        self._stop_server()
        self._set_state(FAILED, message)

    def _set_state(self, state: str, detail: str) -> None:
        if (state, detail) != (self.state, self.detail):
            self.state, self.detail = state, detail
            self.stateChanged.emit(state, detail)

    def _on_activity(self, gen: int, _snapshot: dict) -> None:  # HTTP threads
        # plain reads of what the UI thread writes: a stale answer costs one harmless wake at most
        if not self._closed and gen == self._gen:
            self._wake.post()

    def _on_wake(self) -> None:
        # a fresh snapshot: callbacks from several HTTP threads may arrive out of order
        if self.server is not None and not self._closed:
            self.activityChanged.emit(self.server.activity.snapshot())
