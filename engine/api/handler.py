"""The HTTP side of the API: the listening server, and the per-connection handler that checks
access, routes /v1/models and /v1/chat/completions, reads bodies and sends JSON and errors."""
from __future__ import annotations

import json
import logging
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from ..events import Turn
from .completion import ChatTurn, complete
from .errors import ApiError, ClientGone
from .request import parse_chat_request
from .streaming import stream

log = logging.getLogger(__name__)


class HttpServer(ThreadingHTTPServer):
    """Serves `api` (an ApiServer); remembers open connections so stopping can close them."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, address, family, api):
        self.address_family = family
        self.api = api
        self.open_sockets: set = set()
        self.sockets_lock = threading.Lock()
        super().__init__(address, RequestHandler)

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


class RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "Parley"
    sys_version = ""
    disable_nagle_algorithm = True  # tokens go out as they come
    timeout = 120  # an idle keep-alive connection is closed after this

    server: HttpServer

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
        self.headers_sent = False
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
            api.access.check(self.headers, api.address[0])
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
        if self.headers_sent:
            return
        big = self._body_left
        try:
            self._discard_body()
        except OSError:
            self.close_connection = True
        if err.status == 401:
            self._extra_headers.append(("WWW-Authenticate", 'Bearer realm="parley"'))
        try:
            self.send_json(err.status, err.body())
            if self.close_connection and big > 0:
                self._drain_after_close(big)
        except OSError:
            self.close_connection = True

    def send_json(self, status: int, obj: dict) -> None:
        data = json.dumps(obj, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in self._extra_headers:
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers_with(b"" if self._is_head else data)

    def end_headers_with(self, body: bytes) -> None:
        """Headers and the first bytes of the body in one write: no small-packet (Nagle) stall."""
        self._headers_buffer.append(b"\r\n" + body)
        self.flush_headers()
        self.headers_sent = True

    def client_gone(self) -> bool:
        if self.server.api.closing:
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
            return self.send_json(200, {"object": "list", "data": models})
        for m in models:
            if m["id"] == wanted:
                return self.send_json(200, m)
        raise ApiError(404, f"The model {wanted!r} is not loaded.", "model", "model_not_found")

    def _chat(self) -> None:
        api = self.server.api
        raw = self._read_body()
        if api.engine.loaded is None:
            raise ApiError(503, "No model is loaded yet.", None, "model_not_loaded")
        req = parse_chat_request(raw, api.pictures, api.max_pictures)
        with api.open_turn(tokens=req.stream or bool(req.stops)) as (tid, q):
            api.activity.begin(self.client_address[0])
            try:
                api.engine.submit(Turn("", req.messages, req.sampling, None, tid))
                turn = ChatTurn(api, tid, q, req, self.client_gone)
                if req.stream:
                    stream(turn, self)
                else:
                    complete(turn, self.send_json)
            finally:
                api.activity.end()
