"""Clients that go away: a vanished client stops its generation at once, and an HTTP/1.0
client gets a plain event stream."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from engine.protocol.events import Message, Token, TurnDone
from tests.helpers.api_served import assert_good_request_works, served, user  # noqa: F401 (fixture)

openai = pytest.importorskip("openai")


# ---------------------------------------------------------------- clients that go away


class _ApiTurn:
    """Listens for the API client's turn: set when it produces a token and when it ends."""

    def __init__(self):
        self.generating, self.finished = threading.Event(), threading.Event()
        self.done: TurnDone | None = None

    def __call__(self, ev) -> None:
        if getattr(ev, "conversation_id", "").startswith("api:"):
            if isinstance(ev, Token):
                self.generating.set()
            elif isinstance(ev, TurnDone):
                self.done = ev
                self.finished.set()

    def wait_done(self, timeout: float) -> TurnDone:
        assert self.finished.wait(timeout), "the engine did not finish the turn"
        return self.done


@pytest.mark.slow
@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_stops_the_generation(served, stream):
    engine = served.engine
    listen = _ApiTurn()
    engine.add_listener(listen)
    body = json.dumps(
        {
            "model": served.model,
            "messages": [user(f"Tell me a very long story ({stream}).")],
            "max_tokens": 30000,
            "temperature": 0,
            "stream": stream,
        }
    ).encode()
    host, port = served.server.address
    sock = socket.create_connection((host, port), timeout=30)
    try:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        if stream:
            got = b""
            while got.count(b"data: ") < 3:
                chunk = sock.recv(4096)
                assert chunk, got
                got += chunk
            assert got.startswith(b"HTTP/1.1 200")
        else:
            assert listen.generating.wait(30), "the turn never started generating"
        t_close = time.monotonic()
    finally:
        sock.close()
    try:
        ev = listen.wait_done(20)
        assert ev.stopped and len(ev.token_ids) < 30000
        assert time.monotonic() - t_close < 5
    finally:
        engine.remove_listener(listen)
    assert served.server.activity.snapshot()["disconnects"] >= 1
    assert_good_request_works(served)


@pytest.mark.slow
def test_http_10_client_gets_a_plain_event_stream(served):
    body = json.dumps({"messages": [user("Hello there")], "max_tokens": 4, "temperature": 0, "stream": True})
    host, port = served.server.address
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body.encode())
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"chunked" not in head.lower()
    events = [line[6:] for line in payload.decode().split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert text == served.ref_text([Message("user", "Hello there")], 4)[0]
