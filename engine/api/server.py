"""An OpenAI-compatible HTTP API over the running Engine (standard library only, no Qt).

Requests become ordinary engine turns with an empty conversation id, so they wait in the same
FIFO queue as the window's turns and run on the same model-owner thread with the same caches.
The engine continues whichever stateless session shares the longest token prefix, so a client
that re-sends its whole conversation each turn only pays for the new part, and re-sent pictures
are image-cache hits that never wake the encoder.
"""
from __future__ import annotations

import hashlib
import sys
import hmac
import ipaddress
import json
import logging
import queue
import select
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from ..events import Token, Turn, TurnDone, TurnFailed
from .errors import ApiConfigError, ApiError
from .pictures import PictureStore
from .request import ChatRequest, parse_chat_request
from .stops import StopScanner

log = logging.getLogger(__name__)

POLL_S = 0.2  # how often a waiting request checks that its client is still there
FLUSH_S = 0.05  # streamed text goes out at most this often (tokens in between share one chunk)


class ClientGone(Exception):
    pass


# ---------------------------------------------------------------- binding rules

def _ip_is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%")[0]).is_loopback
    except ValueError:
        return False


def is_loopback(host: str) -> bool:
    """True when every address `host` names is a loopback address ("" and 0.0.0.0 are not)."""
    if not host:
        return False
    if _ip_is_loopback(host):
        return True
    try:
        ipaddress.ip_address(host.strip("[]"))
        return False  # a literal address that is not loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(infos) and all(_ip_is_loopback(info[4][0]) for info in infos)


def check_bind(host: str, token: str | None) -> None:
    """Refuse a network-reachable server without a token before anything is loaded."""
    if token is not None and (not token or any(c.isspace() for c in token)):
        raise ApiConfigError("The API token must be a non-empty string without spaces.")
    if not is_loopback(host) and not token:
        shown = host or "all interfaces"
        raise ApiConfigError(
            f"Refusing to serve the API on {shown}: that address is reachable from other machines, and "
            f"without a token anyone there could use the model. Pass --api-token (every request then needs "
            f"'Authorization: Bearer <token>'), or bind to 127.0.0.1.")


def _name_is_local(host: str | None) -> bool:
    if not host:
        return False
    h = host.lower().rstrip(".")
    return h == "localhost" or h.endswith(".localhost") or _ip_is_loopback(h)


def _host_header_name(value: str) -> str:
    value = value.strip()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


# ---------------------------------------------------------------- activity (for the VRAM panel)

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
            return {"requests": self.requests, "active": self.active, "errors": self.errors,
                    "disconnects": self.disconnects, "last_client": self.last_client,
                    "last_request_at": self.last_request_at}

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


# ---------------------------------------------------------------- the server

class _Http(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, address, family, api: "ApiServer"):
        self.address_family = family
        self.api = api
        self.open_sockets: set = set()
        self.sockets_lock = threading.Lock()
        super().__init__(address, _Handler)

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return  # a client that hung up or idled out: nothing to report
        log.exception("API connection from %s failed", client_address)

    def server_bind(self):
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        super().server_bind()

    def get_request(self):
        sock, addr = super().get_request()
        with self.sockets_lock:
            self.open_sockets.add(sock)
        return sock, addr

    def shutdown_request(self, request):
        with self.sockets_lock:
            self.open_sockets.discard(request)
        super().shutdown_request(request)


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
        self.token = token
        self._token_digest = hashlib.sha256(token.encode()).digest() if token else None
        self.max_body_bytes = max_body_bytes
        self.max_pictures = max_pictures
        self.max_pending = max_pending
        self.pictures = PictureStore(Path(data_dir or engine.data_dir) / "api-pictures", max_picture_bytes)
        self.activity = ApiActivity(on_activity)
        self._turns: dict[int, tuple[queue.Queue, bool]] = {}  # turn id -> (its events, wants tokens)
        self._turns_lock = threading.Lock()
        self._closing = False
        self._thread: threading.Thread | None = None
        try:
            infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except OSError as exc:
            raise ApiConfigError(f"Cannot resolve {host!r}: {exc}") from None
        family, _, _, _, sockaddr = infos[0]
        try:
            self._httpd = _Http(sockaddr[:2], family, self)
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
        self._closing = True
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
    def _turn(self, tokens: bool = True):
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

    # ------------------------------------------------------------ access checks

    def check_access(self, headers) -> None:
        if self._token_digest is not None:
            auth = headers.get("Authorization", "")
            scheme, _, given = auth.partition(" ")
            ok = scheme.lower() == "bearer" and hmac.compare_digest(
                hashlib.sha256(given.strip().encode()).digest(), self._token_digest)
            if not ok:
                raise ApiError(401, "Missing or wrong API token: send 'Authorization: Bearer <token>'.", None,
                               "invalid_api_key")
            return
        # no token (loopback only): refuse what a web page could send, and DNS rebinding
        host = headers.get("Host")
        if host is not None and not self._host_allowed(_host_header_name(host)):
            raise ApiError(403, f"Host {host!r} is not allowed; the API answers on localhost only.", None,
                           "host_not_allowed")
        origin = headers.get("Origin")
        if origin is not None and not _name_is_local(urlsplit(origin).hostname):
            raise ApiError(403, "Requests from web pages are not allowed without an API token.", None,
                           "origin_not_allowed")

    def _host_allowed(self, name: str) -> bool:
        if _name_is_local(name):
            return True
        local = {self.address[0].lower(), socket.gethostname().lower()}
        return name.lower().rstrip(".") in local

    def model_name(self) -> str | None:
        loaded = self.engine.loaded
        return loaded.name if loaded is not None else None


def _failure_status(message: str) -> ApiError:
    if message.startswith("No model is loaded"):
        return ApiError(503, message, None, "model_not_loaded")
    if message.startswith("The model failed"):
        return ApiError(500, message, None, "model_error")
    return ApiError(400, message, "messages", "invalid_request")


def _usage(done: TurnDone) -> dict:
    s = done.stats or {}
    prompt = int(s.get("prompt_tokens", 0))
    completion = len(done.token_ids)
    cached = int(s.get("reused_tokens", 0)) + int(s.get("restored_tokens", 0))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "Parley"
    sys_version = ""
    disable_nagle_algorithm = True  # tokens go out as they come
    timeout = 120  # an idle keep-alive connection is closed after this

    server: _Http

    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self):
        self._handle("GET")

    def do_POST(self):
        self._handle("POST")

    def do_PUT(self):
        self._handle("PUT")

    def do_DELETE(self):
        self._handle("DELETE")

    def do_PATCH(self):
        self._handle("PATCH")

    def do_OPTIONS(self):
        self._handle("OPTIONS")

    def do_HEAD(self):
        self._handle("HEAD")

    # ------------------------------------------------------------ plumbing

    def _handle(self, method: str) -> None:
        api = self.server.api
        self._headers_sent = False
        self._extra_headers: list[tuple[str, str]] = []
        self._is_head = method == "HEAD"
        te = self.headers.get("Transfer-Encoding")
        if te and te.lower() != "identity":
            self.close_connection = True  # a body we do not read must not be taken for the next request
        try:
            self._body_left = int(self.headers.get("Content-Length") or 0)
            if self._body_left < 0:
                raise ValueError
        except ValueError:
            self._body_left = 0
            self.close_connection = True
            return self._send_error(ApiError(400, "Bad Content-Length header.", None, "invalid_request"))
        try:
            api.check_access(self.headers)
            path = urlsplit(self.path).path.rstrip("/") or "/"
            if path == "/v1/chat/completions":
                self._allow(method, "POST")
                return self._chat()
            if path == "/v1/models":
                self._allow(method, "GET")
                return self._models(None)
            if path.startswith("/v1/models/"):
                self._allow(method, "GET")
                return self._models(path[len("/v1/models/"):])
            raise ApiError(404, f"Unknown path {path!r} (Parley serves /v1/models and /v1/chat/completions).",
                           None, "not_found")
        except ApiError as err:
            self._send_error(err)
        except ClientGone:
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:
            log.exception("API request failed")
            self._send_error(ApiError(500, f"Internal error: {type(exc).__name__}: {exc}", None, "internal_error"))

    def _allow(self, method: str, allowed: str) -> None:
        if method != allowed:
            self._extra_headers.append(("Allow", allowed))
            raise ApiError(405, f"Method {method} is not allowed here (use {allowed}).", None, "method_not_allowed")

    def _read_body(self) -> bytes:
        api = self.server.api
        te = self.headers.get("Transfer-Encoding")
        if te and te.lower() != "identity":
            self.close_connection = True
            raise ApiError(411, "Send the body with a Content-Length (chunked uploads are not supported).", None,
                           "length_required")
        if self.headers.get("Content-Length") is None:
            raise ApiError(411, "A Content-Length header is required.", None, "length_required")
        n = self._body_left
        if n > api.max_body_bytes:
            raise ApiError(413, f"The request body is too large ({n} bytes; the limit is {api.max_body_bytes}).",
                           None, "body_too_large")
        data = self.rfile.read(n)
        self._body_left = 0
        if len(data) < n:
            raise ClientGone()
        return data

    def _discard_body(self) -> None:
        """After an error: keep the connection usable, or close it when the body is too big."""
        n, self._body_left = self._body_left, 0
        if n <= 0:
            return
        if n <= self.server.api.max_body_bytes:
            self.rfile.read(n)
            return
        self.close_connection = True

    def _drain_after_close(self, n: int) -> None:
        """Read (a bounded part of) a refused body so the client sees our answer, not a reset."""
        deadline = time.monotonic() + 2.0
        try:
            self.connection.settimeout(0.5)
            left = min(n, 4 * self.server.api.max_body_bytes)
            while left > 0 and time.monotonic() < deadline:
                chunk = self.rfile.read1(min(left, 1 << 20))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:
            pass

    def _send_error(self, err: ApiError) -> None:
        self.server.api.activity.count("errors")
        if self._headers_sent:
            return
        big = self._body_left
        try:
            self._discard_body()
        except OSError:
            self.close_connection = True
        if err.status == 401:
            self._extra_headers.append(("WWW-Authenticate", 'Bearer realm="parley"'))
        try:
            self._send_json(err.status, err.body())
            if self.close_connection and big > 0:
                self._drain_after_close(big)
        except OSError:
            self.close_connection = True

    def _send_json(self, status: int, obj: dict) -> None:
        data = json.dumps(obj, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in self._extra_headers:
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self._end_headers_with(b"" if self._is_head else data)

    def _end_headers_with(self, body: bytes) -> None:
        """Headers and the first bytes of the body in one write: no small-packet (Nagle) stall."""
        self._headers_buffer.append(b"\r\n" + body)
        self.flush_headers()
        self._headers_sent = True

    def _client_gone(self) -> bool:
        if self.server.api._closing:
            return True
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    # ------------------------------------------------------------ endpoints

    def _models(self, wanted: str | None) -> None:
        api = self.server.api
        name = api.model_name()
        models = [] if name is None else [{"id": name, "object": "model", "created": 0, "owned_by": "parley"}]
        if wanted is None:
            return self._send_json(200, {"object": "list", "data": models})
        for m in models:
            if m["id"] == wanted:
                return self._send_json(200, m)
        raise ApiError(404, f"The model {wanted!r} is not loaded.", "model", "model_not_found")

    def _chat(self) -> None:
        api = self.server.api
        raw = self._read_body()
        if api.engine.loaded is None:
            raise ApiError(503, "No model is loaded yet.", None, "model_not_loaded")
        req = parse_chat_request(raw, api.pictures, api.max_pictures)
        with api._turn(tokens=req.stream or bool(req.stops)) as (tid, q):
            api.activity.begin(self.client_address[0])
            try:
                api.engine.submit(Turn("", req.messages, req.sampling, None, tid))
                (self._stream if req.stream else self._complete)(tid, q, req)
            finally:
                api.activity.end()

    def _events(self, tid: int, q: queue.Queue, due: Callable[[], float | None] = lambda: None):
        """Batches of this turn's events until it is done; a vanished client stops the turn.
        `due()` may name a moment (monotonic) by which the caller wants a batch, even an empty one."""
        self._turn_over = False
        checked = time.monotonic()
        while True:
            wake = due()
            timeout = POLL_S if wake is None else min(POLL_S, max(0.0, wake - time.monotonic()))
            try:
                batch = [q.get(timeout=timeout)]
                try:
                    while True:
                        batch.append(q.get_nowait())
                except queue.Empty:
                    pass
            except queue.Empty:
                batch = []
            self._turn_over = any(isinstance(e, (TurnDone, TurnFailed)) for e in batch)
            if time.monotonic() - checked >= POLL_S:
                checked = time.monotonic()
                if not self._turn_over and self._client_gone():
                    self._abandon(tid)
            yield batch
            if self._turn_over:
                return

    def _abandon(self, tid: int):
        """The client went away: stop its generation (unless it is already over)."""
        if not self._turn_over:
            self.server.api.engine.stop(tid)
        self.server.api.activity.count("disconnects")
        raise ClientGone()

    def _finish_reason(self, done: TurnDone, req: ChatRequest, scanner: StopScanner) -> str:
        if scanner.hit or done.stopped:
            return "stop"
        loaded = self.server.api.engine.loaded
        eos = loaded.eos_ids if loaded is not None else set()
        if done.token_ids and done.token_ids[-1] in eos:
            return "stop"
        return "length" if len(done.token_ids) >= req.sampling.max_new_tokens else "stop"

    def _feed(self, ev: Token, scanner: StopScanner, tid: int) -> str:
        hit_before = scanner.hit
        piece = scanner.push(ev.text)
        if scanner.hit and not hit_before:
            self.server.api.engine.stop(tid)
        return piece

    def _complete(self, tid: int, q: queue.Queue, req: ChatRequest) -> None:
        scanner = StopScanner(req.stops)
        for batch in self._events(tid, q):
            for ev in batch:
                if isinstance(ev, Token):
                    self._feed(ev, scanner, tid)
                elif isinstance(ev, TurnFailed):
                    raise _failure_status(ev.message)
                elif isinstance(ev, TurnDone):
                    if not req.stops:
                        scanner.push(ev.reply)  # tokens were not sent here: the reply is the text
                    scanner.flush()
                    return self._send_json(200, {
                        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                        "created": int(time.time()), "model": self.server.api.model_name() or "",
                        "system_fingerprint": None,
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": scanner.text},
                                     "logprobs": None, "finish_reason": self._finish_reason(ev, req, scanner)}],
                        "usage": _usage(ev),
                    })

    def _stream(self, tid: int, q: queue.Queue, req: ChatRequest) -> None:
        api = self.server.api
        scanner = StopScanner(req.stops)
        cid, created, model = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), api.model_name() or ""

        def chunk(delta: dict, finish: str | None = None) -> bytes:
            obj = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                   "system_fingerprint": None,
                   "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            if req.include_usage:
                obj["usage"] = None
            return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"

        pending: list[str] = []  # text not sent yet: tokens go out at most every FLUSH_S, joined
        last_write = [0.0]
        for batch in self._events(tid, q, lambda: last_write[0] + FLUSH_S if pending else None):
            out: list[bytes] = []
            for ev in batch:
                if isinstance(ev, Token):
                    piece = self._feed(ev, scanner, tid)
                    if piece:
                        pending.append(piece)
                elif isinstance(ev, TurnFailed):
                    err = _failure_status(ev.message)
                    if not self._headers_sent:
                        raise err
                    out.append(b"data: " + json.dumps(err.body()).encode() + b"\n\n")
                    out.append(b"data: [DONE]\n\n")
                elif isinstance(ev, TurnDone):
                    tail = scanner.flush()
                    if tail:
                        pending.append(tail)
                    out.append(chunk({}, self._finish_reason(ev, req, scanner)))
                    if req.include_usage:
                        obj = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                               "system_fingerprint": None, "choices": [], "usage": _usage(ev)}
                        out.append(b"data: " + json.dumps(obj).encode() + b"\n\n")
                    out.append(b"data: [DONE]\n\n")
            now = time.monotonic()
            if pending and (self._turn_over or now - last_write[0] >= FLUSH_S):
                out.insert(0, chunk({"content": "".join(pending)}))
                pending.clear()
            if not out:
                continue
            last_write[0] = now
            if not self._headers_sent:
                out.insert(0, chunk({"role": "assistant", "content": ""}))
            body = data = b"".join(out)
            chunked = self.request_version != "HTTP/1.0"  # an HTTP/1.0 client reads until we close
            if chunked:
                body = b"%x\r\n%s\r\n" % (len(data), data)
                if self._turn_over:
                    body += b"0\r\n\r\n"  # the chunked body's end
            try:
                if not self._headers_sent:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream; charset=utf-8")
                    self.send_header("Cache-Control", "no-cache")
                    if chunked:
                        self.send_header("Transfer-Encoding", "chunked")
                    else:
                        self.close_connection = True
                        self.send_header("Connection", "close")
                    self.send_header("X-Accel-Buffering", "no")
                    self._end_headers_with(body)
                else:
                    self.wfile.write(body)
            except OSError:
                self._abandon(tid)
