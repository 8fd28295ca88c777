"""An OpenAI-compatible HTTP API over the running Engine (standard library only, no Qt).

Requests become ordinary engine turns with an empty conversation id, so they wait in the same
FIFO queue as the window's turns and run on the same model-owner thread with the same caches.
The engine continues whichever stateless session shares the longest token prefix, so a client
that re-sends its whole conversation each turn only pays for the new part, and re-sent pictures
are image-cache hits that never wake the encoder.
"""
from __future__ import annotations

import queue
import socket
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from ..events import Token
from .access import AccessCheck, check_bind
from .activity import ApiActivity
from .errors import ApiConfigError, ApiError
from .handler import HttpServer
from .pictures import PictureStore


class ApiServer:
    """`ApiServer(engine, host, port, token, data_dir).start()`; `.address`, `.url`, `.stop()`.

    `port=0` takes any free port (see `.address`). Binding happens in the constructor, so a port
    in use or a refused bind fails before the model loads."""

    def __init__(self, engine, host: str = "127.0.0.1", port: int = 8011, token: str | None = None,
                 data_dir: str | Path | None = None, *, max_body_bytes: int = 32 << 20, max_pictures: int = 16,
                 max_pending: int = 32, max_picture_bytes: int = 2 << 30,
                 on_activity: Callable[[dict], None] | None = None):
        check_bind(host, token)
        self.engine = engine
        self.access = AccessCheck(token)
        self.max_body_bytes = max_body_bytes
        self.max_pictures = max_pictures
        self.max_pending = max_pending
        self.pictures = PictureStore(Path(data_dir or engine.data_dir) / "api-pictures", max_picture_bytes)
        self.activity = ApiActivity(on_activity)
        self._turns: dict[int, tuple[queue.Queue, bool]] = {}  # turn id -> (its events, wants tokens)
        self._turns_lock = threading.Lock()
        self.closing = False
        self._thread: threading.Thread | None = None
        try:
            infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except OSError as exc:
            raise ApiConfigError(f"Cannot resolve {host!r}: {exc}") from None
        family, _, _, _, sockaddr = infos[0]
        try:
            self._httpd = HttpServer(sockaddr[:2], family, self)
        except OSError as exc:
            raise ApiConfigError(f"Cannot listen on {host}:{port}: {exc.strerror or exc}") from None

    # ------------------------------------------------------------ lifecycle

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._httpd.server_address[:2]
        return host, port

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}/v1"

    def start(self) -> "ApiServer":
        if self._thread is None:
            self.engine.add_listener(self._on_event)
            self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                            name="parley-api", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving: turns of requests still in flight are stopped, connections closed."""
        self.closing = True
        with self._turns_lock:
            pending = list(self._turns)
        for tid in pending:
            self.engine.stop(tid)
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(10)
            self._thread = None
        self._httpd.server_close()
        with self._httpd.sockets_lock:
            socks = list(self._httpd.open_sockets)
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.engine.remove_listener(self._on_event)

    # ------------------------------------------------------------ engine events -> requests

    def _on_event(self, ev) -> None:  # owner thread: must be quick
        tid = getattr(ev, "turn_id", None)
        if tid is None:
            return
        entry = self._turns.get(tid)
        if entry is not None and (entry[1] or not isinstance(ev, Token)):
            entry[0].put(ev)

    @contextmanager
    def open_turn(self, tokens: bool = True):
        """A turn id and the queue its events arrive in; without `tokens` only the end arrives
        (a plain reply needs no per-token wake-ups)."""
        with self._turns_lock:
            if len(self._turns) >= self.max_pending:
                raise ApiError(429, f"Too many requests in progress (at most {self.max_pending}); retry later.",
                               None, "too_many_requests")
            tid = self.engine.new_turn_id()
            q = queue.Queue()
            self._turns[tid] = (q, tokens)
        try:
            yield tid, q
        finally:
            with self._turns_lock:
                self._turns.pop(tid, None)

    def model_name(self) -> str | None:
        loaded = self.engine.loaded
        return loaded.name if loaded is not None else None
