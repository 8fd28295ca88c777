"""An OpenAI-compatible HTTP API over the running Engine, served by uvicorn (no Qt here).

Requests become ordinary engine turns with an empty conversation id, so they wait in the same
FIFO queue as the window's turns and run on the same model-owner thread with the same caches.
The engine continues whichever stateless session shares the longest token prefix, so a client
that re-sends its whole conversation each turn only pays for the new part, and re-sent pictures
are image-cache hits that never wake the encoder.

Under load: the listening socket has a real backlog; at most `max_requests` requests are served
at once and at most `max_pending` chat requests are in progress (more get 429 with Retry-After
before their body is read); connections that have not sent a request head cost no place among
them: each gets `head_timeout_s` to send one, and past `max_waiting` of them the one waiting
longest is closed (guard.py says why uvicorn's own limit is not used); bodies are capped (413 at
once); a client gets `client_timeout_s` for each part of its body (slow-loris).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import anyio
import uvicorn

from ..pictures.store import PictureStore
from ..platform.files import raise_open_file_limit
from ..protocol.events import Token
from .access import AccessCheck, check_bind
from .activity import ApiActivity
from .completion import GONE
from .errors import ApiConfigError, ApiError
from .guard import guarded_protocol
from .handler import ApiApp
from .pictures import drop_legacy_folder
from .prompt_size import PromptMeter
from .request import ChatRequest, parse_chat_request

SWEEP_EVERY_S = 3600.0  # how often expired API pictures are looked for


class ApiServer:
    """`ApiServer(engine, host, port, token, data_dir).start()`; `.address`, `.url`, `.stop()`.

    `port=0` takes any free port (see `.address`). Binding happens in the constructor, so a port
    in use or a refused bind fails before the model loads."""

    def __init__(
        self,
        engine,
        host: str = "127.0.0.1",
        port: int = 8011,
        token: str | None = None,
        data_dir: str | Path | None = None,
        *,
        max_body_bytes: int = 20 << 20,
        max_pictures: int = 16,
        max_pending: int = 32,
        max_requests: int = 256,
        backlog: int = 2048,
        head_timeout_s: float = 5.0,
        client_timeout_s: float = 30.0,
        body_timeout_s: float = 120.0,
        prepare_workers: int = 4,
        max_waiting: int | None = None,
        max_picture_bytes: int = 2 << 30,
        picture_max_age_s: float = 7 * 86400.0,
        on_activity: Callable[[dict], None] | None = None,
    ):
        check_bind(host, token)
        self.engine = engine
        self.access = AccessCheck(token)
        self.max_body_bytes = max_body_bytes
        self.max_pictures = max_pictures
        self.max_pending = max_pending
        self.max_requests = max_requests
        self.head_timeout_s = head_timeout_s
        self.client_timeout_s = client_timeout_s
        self.body_timeout_s = body_timeout_s
        self.data_dir = Path(data_dir or engine.data_dir)
        self.pictures = PictureStore(self.data_dir / "pictures", max_picture_bytes, max_age_s=picture_max_age_s)
        self.meter = PromptMeter()
        self.activity = ApiActivity(on_activity)
        self.prepare_limiter = anyio.CapacityLimiter(prepare_workers)  # bodies parsed at once
        # turn id -> (the loop its request waits on, its event queue, wants tokens)
        self._turns: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Queue, bool]] = {}
        self._turns_lock = threading.Lock()
        # chat requests: reading, parsing, queued or generating
        self._chats = _Places(max_pending, "requests in progress")
        self._requests = _Places(max_requests, "requests being served")  # requests of any kind
        self.closing = False
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._sweeper: threading.Thread | None = None
        self._sock = _bind(host, port, backlog)
        self._address = self._sock.getsockname()[:2]
        if max_waiting is None:  # idle connections may take at most half the descriptors this process has
            max_waiting = max(64, min(8192, (raise_open_file_limit() - 256) // 2))
        self.max_waiting = max_waiting
        config = uvicorn.Config(
            ApiApp(self),
            http=guarded_protocol(head_timeout_s, max_waiting),
            lifespan="off",
            log_config=None,
            access_log=False,
            backlog=backlog,
            server_header=False,
            headers=[("Server", "Parley")],
            limit_concurrency=None,
            timeout_keep_alive=max(1, int(head_timeout_s)),
            timeout_graceful_shutdown=3,
            h11_max_incomplete_event_size=64 << 10,
        )
        self._uvicorn = uvicorn.Server(config)

    # ------------------------------------------------------------ lifecycle

    @property
    def address(self) -> tuple[str, int]:
        return self._address

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}/v1"

    def start(self) -> ApiServer:
        if self._thread is None:
            self.engine.add_listener(self._on_event)
            self._thread = threading.Thread(
                target=self._uvicorn.run, kwargs={"sockets": [self._sock]}, name="parley-api", daemon=True
            )
            self._thread.start()
            drop_legacy_folder(self.data_dir)
            self.pictures.sweep()  # aged-out pictures go before the first request
            self._sweeper = threading.Thread(target=self._sweep_pictures, name="parley-api-sweep", daemon=True)
            self._sweeper.start()
        return self

    def stop(self) -> None:
        """Stop serving: turns of requests still in flight are stopped, connections closed."""
        self.closing = True
        self._stopped.set()
        with self._turns_lock:
            pending = list(self._turns.items())
        for tid, (loop, q, _) in pending:
            self.engine.stop(tid)
            _put(loop, q, GONE)
        if self._thread is not None:
            self._uvicorn.should_exit = True
            self._thread.join(10)
            self._thread = None
        self._sock.close()
        self.engine.remove_listener(self._on_event)

    def _sweep_pictures(self) -> None:
        while not self._stopped.wait(SWEEP_EVERY_S):
            self.pictures.sweep()

    # ------------------------------------------------------------ requests

    def serving(self):
        """A place among the `max_requests` requests being served, or a 429 with Retry-After."""
        return self._requests.take()

    def admit(self):
        """A place among the `max_pending` chat requests in progress, or a 429 with Retry-After."""
        return self._chats.take()

    def prepare(self, raw: bytes, loaded) -> ChatRequest:
        """Parse a chat request's body, store its pictures (held until `req.hold` is released)
        and make sure its text can fit the context (worker thread: neither the event loop nor
        the model thread)."""
        hold = self.pictures.hold()
        try:
            req = parse_chat_request(
                raw,
                self.pictures,
                self.max_pictures,
                served_model=loaded.name,
                max_text_chars=self.meter.max_chars(loaded),
                hold=hold,
            )
            self.meter.check(req.messages, loaded)
        except BaseException:
            hold.release()
            raise
        return req

    @contextmanager
    def open_turn(self, tokens: bool = True):
        """A turn id and the asyncio queue its events arrive in; without `tokens` only the end
        arrives (a plain reply needs no per-token wake-ups)."""
        q: asyncio.Queue = asyncio.Queue()
        with self._turns_lock:
            tid = self.engine.new_turn_id()
            self._turns[tid] = (asyncio.get_running_loop(), q, tokens)
        try:
            yield tid, q
        finally:
            with self._turns_lock:
                self._turns.pop(tid, None)

    def _on_event(self, ev) -> None:  # owner thread: must be quick
        tid = getattr(ev, "turn_id", None)
        if tid is None:
            return
        entry = self._turns.get(tid)
        if entry is not None and (entry[2] or not isinstance(ev, Token)):
            _put(entry[0], entry[1], ev)

    def model_name(self) -> str | None:
        loaded = self.engine.loaded
        return loaded.name if loaded is not None else None


class _Places:
    """At most `limit` at once (any thread); one more is answered 429 with Retry-After."""

    def __init__(self, limit: int, what: str):
        self.limit, self.what = limit, what
        self.taken = 0
        self._lock = threading.Lock()

    @contextmanager
    def take(self):
        with self._lock:
            if self.taken >= self.limit:
                raise ApiError(
                    429,
                    f"Too many {self.what} (at most {self.limit}); retry later.",
                    None,
                    "too_many_requests",
                    {"Retry-After": "1"},
                )
            self.taken += 1
        try:
            yield
        finally:
            with self._lock:
                self.taken -= 1


def _put(loop: asyncio.AbstractEventLoop, q: asyncio.Queue, item) -> None:
    try:
        loop.call_soon_threadsafe(q.put_nowait, item)
    except RuntimeError:
        pass  # the loop has closed: nobody waits for this turn any more


def _bind(host: str, port: int, backlog: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise ApiConfigError(f"Cannot resolve {host!r}: {exc}") from None
    family, _, proto, _, sockaddr = infos[0]
    # the protocol named (IPPROTO_TCP, not 0): asyncio turns Nagle off (TCP_NODELAY) only on
    # connections whose socket says TCP, and with Nagle on a plain reply's body waited for the
    # client's delayed ACK of its headers: ~45 ms on every non-streamed API turn
    sock = socket.socket(family, socket.SOCK_STREAM, proto or socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(sockaddr[:2] if family == socket.AF_INET else sockaddr)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise ApiConfigError(f"Cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock
