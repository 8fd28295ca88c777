"""Real servers on loopback for the remote-engine tests: Parley's own `serve` in a second
process, and small stdlib HTTP servers that fail the ways real servers do (401, 404 model,
413, a stream cut mid-reply, a plain web server that is not an API, one that never answers),
and hostile ones (a stream that never ends, usage of the wrong types, a reply that drips,
escape codes in replies and errors, a chunk of the wrong shape after text)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


class ParleyServe:
    """`python main.py serve` on a tiny model, in its own process."""

    def __init__(self, model_dir: Path, data_dir: Path, token: str | None = None):
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        cmd = [
            sys.executable,
            str(ROOT / "main.py"),
            "serve",
            "--port",
            "0",
            "--model",
            str(model_dir),
            "--data-dir",
            str(data_dir),
        ]
        if token:
            cmd += ["--api-token", token]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline()
        if "http://" not in line:
            err = self.proc.stderr.read() if self.proc.poll() is not None else ""
            self.proc.kill()
            raise RuntimeError(f"serve did not start: {line!r} {err}")
        self.url = line[line.index("http://") :].split()[0]  # ends in /v1

    def kill(self) -> None:
        """The server dies (no goodbye): what a crash or a pulled cable looks like."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def close(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                return self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        return self.proc.returncode


def free_port() -> int:
    """A port nothing listens on (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StubServer:
    """A ThreadingHTTPServer on 127.0.0.1 running `handler` in a thread."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.httpd.release = threading.Event()  # lets a stalling handler go at close
        self.httpd.asked = threading.Event()  # set by handlers once a chat request has arrived
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        host, port = self.httpd.server_address[:2]
        self.root = f"http://{host}:{port}"

    def close(self) -> None:
        self.httpd.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


class _Base(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep test output clean
        pass

    def _json(self, code: int, obj: dict) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _models(self) -> None:
        self._json(
            200, {"object": "list", "data": [{"id": "big-vlm", "object": "model", "created": 0, "owned_by": "test"}]}
        )

    def _error(self, code: int, message: str, kind: str) -> None:
        self._json(code, {"error": {"message": message, "type": kind, "code": code}})


class Unauthorized(_Base):
    def do_GET(self):
        self._error(401, "Invalid API key.", "authentication_error")

    def do_POST(self):
        self._body()
        self._error(401, "Invalid API key.", "authentication_error")


class Forbidden(_Base):
    """A key the server knows but that may not use this model."""

    def do_GET(self):
        self._models()

    def do_POST(self):
        self._body()
        self._error(403, "This key may not use big-vlm.", "permission_error")


class Strict(_Base):
    """vLLM's answers: 404 for a model it does not serve, 413 past its body limit."""

    LIMIT = 4096

    def do_GET(self):
        self._models()

    def do_POST(self):
        body = self._body()
        if len(body) > self.LIMIT:
            return self._error(
                413, f"Request body too large ({len(body)} > {self.LIMIT} bytes).", "invalid_request_error"
            )
        model = json.loads(body).get("model")
        if model != "big-vlm":
            return self._error(404, f"The model `{model}` does not exist.", "NotFoundError")
        self._error(400, "unexpected", "invalid_request_error")


def _chunk(text: str | None, finish: str | None = None) -> bytes:
    obj = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "big-vlm",
        "choices": [{"index": 0, "delta": {"content": text} if text is not None else {}, "finish_reason": finish}],
    }
    return f"data: {json.dumps(obj)}\n\n".encode()


class _Streaming(_Base):
    """A 200 text/event-stream answer, chunked; `send(bytes)` writes one HTTP chunk."""

    def do_GET(self):
        self._models()

    def _start(self):
        self._body()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def send(self, data: bytes) -> bool:
        """False once the client has gone."""
        try:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
            return True
        except OSError:
            return False

    def finish_stream(self):
        self.send(b"")  # the zero-length chunk ends the body


class DropsMidStream(_Streaming):
    """Streams two pieces of a reply, then the connection is cut (chunked body never ended)."""

    def do_POST(self):
        self._start()
        for piece in ("Half a ", "reply"):
            self.send(_chunk(piece))
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)


class Instant(_Base):
    """Answers every chat request at once with a two-piece streamed reply: what is left of a
    turn's time against it is the client's own work."""

    def do_GET(self):
        self._models()

    def do_POST(self):
        self._body()
        body = _chunk("Hello") + _chunk(" there", "stop") + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class PlainWebsite(_Base):
    """A web server that is not an API: HTML for GET; POST is not supported (501)."""

    def do_GET(self):
        body = b"<html><body><h1>It works!</h1></body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class SlowModels(_Base):
    """Lists its one model ("slow-vlm") only once the test sets `release`; `asked` says the list
    was asked for. A server that takes its time, held by an Event rather than a clock."""

    def do_GET(self):
        self.server.asked.set()
        self.server.release.wait(30)
        self._json(
            200, {"object": "list", "data": [{"id": "slow-vlm", "object": "model", "created": 0, "owned_by": "test"}]}
        )


class NeverAnswers(_Base):
    """Reads the request, then says nothing until the client gives up."""

    def do_GET(self):
        self._models()

    def do_POST(self):
        self._body()
        self.server.asked.set()
        self.server.release.wait(30)


class EndlessStream(_Streaming):
    """Streams "word " pieces until the client leaves (never a finish reason)."""

    def do_POST(self):
        self._start()
        self.server.asked.set()
        n = 0
        while n < 1_000_000 and not self.server.release.is_set() and self.send(_chunk("word ")):
            n += 1
        self.close_connection = True


class EndlessEmpty(_Streaming):
    """Streams chunks with no text, forever: nothing for max_tokens to count."""

    def do_POST(self):
        self._start()
        self.send(_chunk("Hello"))
        while not self.server.release.is_set() and self.send(_chunk("")):
            self.server.release.wait(0.01)
        self.close_connection = True


class Drips(_Streaming):
    """Sends "Hello", then one byte of an event every 0.2 s, an event that never ends. `asked`
    is set with the first drip: by then the client has had 0.2 s to take in "Hello"."""

    def do_POST(self):
        self._start()
        self.send(_chunk("Hello"))
        while not self.server.release.wait(0.2) and self.send(b"x"):
            self.server.asked.set()
        self.close_connection = True


class BadUsage(_Streaming):
    """A whole reply, then a usage chunk whose counts are not numbers."""

    def do_POST(self):
        self._start()
        self.send(_chunk("Hello") + _chunk(" there", "stop"))
        usage = {
            "id": "c1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "big-vlm",
            "choices": [],
            "usage": {
                "prompt_tokens": "abc",
                "completion_tokens": [2],
                "total_tokens": None,
                "prompt_tokens_details": {"cached_tokens": "lots"},
            },
        }
        self.send(f"data: {json.dumps(usage)}\n\n".encode() + b"data: [DONE]\n\n")
        self.finish_stream()


class BadChunkAfterText(_Streaming):
    """ "Hello", then a chunk whose choices are not a list of choices."""

    def do_POST(self):
        self._start()
        self.send(_chunk("Hello"))
        self.send(b'data: {"id": "c1", "object": "chat.completion.chunk", "choices": 7}\n\n')
        self.send(_chunk(" there", "stop") + b"data: [DONE]\n\n")
        self.finish_stream()


ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07\x9b31m"  # title, clear, clipboard write, C1 CSI


class EscapeCodes(_Streaming):
    """A reply with terminal escape codes in it; errors (401) with them in the message."""

    def do_POST(self):
        if "Bearer bad" in (self.headers.get("Authorization") or ""):
            self._body()
            return self._error(401, f"Invalid key{ESCAPES}.", "authentication_error")
        self._start()
        self.send(_chunk("Hello") + _chunk(ESCAPES) + _chunk(" there\n\tok", "stop") + b"data: [DONE]\n\n")
        self.finish_stream()


class TransformersServe:
    """`transformers serve MODEL` (FastAPI + uvicorn, from transformers[serving]) in its own
    process, offline; ready once its /health answers."""

    def __init__(self, model_dir: Path, start_timeout: float = 240.0):
        import shutil
        import time
        import urllib.request

        exe = shutil.which("transformers", path=str(Path(sys.executable).parent)) or "transformers"
        self.port = free_port()
        env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [exe, "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.model = str(model_dir)
        deadline = time.monotonic() + start_timeout
        while True:  # the server says nothing on stdout when it is up: ask it
            if self.proc.poll() is not None:
                raise RuntimeError(f"transformers serve exited: {self.proc.stderr.read()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError("transformers serve did not answer /health in time")
            time.sleep(0.25)  # poll interval while it starts (not a wait for an outcome)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


@pytest.fixture
def stub():
    """stub(handler) -> a started StubServer; all are closed after the test."""
    servers = []

    def start(handler):
        servers.append(StubServer(handler))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def remote(url: str, **kw):
    """A started RemoteEngine on `url` (RemoteConfig.make's keywords: model, stream, ...)."""
    from engine.remote import RemoteConfig, RemoteEngine

    return RemoteEngine(RemoteConfig.make(url, **kw)).start()


def fail_turn(engine, messages=None):
    """Run a turn that must fail: one sentence, the conversation sent untouched, and the engine
    not wedged (the same turn fails again the same way). Returns the TurnFailed."""
    from engine.protocol.client import run_blocking
    from engine.protocol.events import Message, Sampling, Turn, TurnFailed

    messages = messages or [Message("user", "hi")]
    sent = [Message(m.role, m.text, list(m.images)) for m in messages]
    r = run_blocking(engine, Turn("c", sent, Sampling(max_new_tokens=4)), timeout=60)
    assert isinstance(r, TurnFailed), r
    assert sent == messages  # the conversation sent is left as it was
    assert "\n" not in r.message
    # the engine survives: the same turn fails again the same way, it is not wedged
    again = run_blocking(engine, Turn("c", list(messages), Sampling(max_new_tokens=4)), timeout=60)
    assert isinstance(again, TurnFailed) and again.message == r.message
    return r
