"""Stop on a remote engine ends the turn at once (issue 27): it closes the stream instead of waiting
for the server's next piece of text, which a slow server sends seconds later (here: never)."""

from __future__ import annotations

import queue

import pytest

from engine.protocol.events import Message, Sampling, Token, Turn, TurnDone, TurnFailed
from tests.helpers.remote_servers import StubServer, _Base, _chunk, remote

pytest.importorskip("openai")


class OnePieceThenSilence(_Base):
    """Streams one piece of a reply, then sends nothing more until the test ends; notes when the
    client closed the connection."""

    def do_GET(self):
        self._models()

    def do_POST(self):
        self._body()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        data = _chunk("The first piece")
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()
        self.connection.settimeout(60)
        try:  # the client going away reads as end of file here
            gone = self.connection.recv(1) == b""
        except (TimeoutError, ConnectionError):
            gone = True
        self.server.client_gone.put(gone)
        self.server.release.wait(60)
        self.close_connection = True


def test_stop_closes_a_silent_stream_at_once():
    server = StubServer(OnePieceThenSilence)
    server.httpd.client_gone = queue.Queue()
    engine = remote(server.root, model="big-vlm")
    events: queue.Queue = queue.Queue()
    engine.add_listener(events.put)
    try:
        tid = engine.submit(Turn("c", [Message("user", "hi")], Sampling(max_new_tokens=64)))
        while not isinstance(ev := events.get(timeout=30), Token):
            assert not isinstance(ev, (TurnDone, TurnFailed)), ev
        assert ev.text == "The first piece"
        engine.stop(tid)
        # the server sends nothing for 60 s: only closing the stream ends the turn within 10 s
        while not isinstance(ev := events.get(timeout=10), (TurnDone, TurnFailed)):
            pass
        assert isinstance(ev, TurnDone) and ev.stopped and ev.reply == "The first piece"
        assert server.httpd.client_gone.get(timeout=10) is True  # the server saw its client go
        # and the engine carries on: the next turn is served (and stopped) the same way
        tid = engine.submit(Turn("c", [Message("user", "again")], Sampling(max_new_tokens=64)))
        while not isinstance(ev := events.get(timeout=30), Token):
            pass
        engine.stop(tid)
        while not isinstance(ev := events.get(timeout=10), (TurnDone, TurnFailed)):
            pass
        assert isinstance(ev, TurnDone) and ev.stopped
    finally:
        engine.shutdown()
        server.close()
