"""The API under hostile and heavy use, over real sockets on loopback: bursts are queued or
answered 429 (never reset), slow clients are dropped by timeouts while others are served, an
oversized body is refused at once, and requests that cannot fit never reach the model thread."""

from __future__ import annotations

import http.client
import json
import os
import socket
import stat
import threading
import time
from pathlib import Path

import pytest

from engine.api import ApiServer
from engine.api.pictures import store_upload
from engine.api.prompt_size import CHEAP_CHARS_PER_TOKEN
from engine.pictures.store import PictureStore
from engine.protocol.events import TurnStarted
from tests.fixtures.pictures import picture_bytes
from tests.helpers.engine_helpers import open_engine

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def engine(tiny_model, tmp_path_factory):
    eng = open_engine(tiny_model("llava"), tmp_path_factory.mktemp("api-load") / "data")
    yield eng
    eng.shutdown()


@pytest.fixture
def serve(engine):
    servers = []

    def make(**kw) -> ApiServer:
        servers.append(ApiServer(engine, "127.0.0.1", 0, **kw).start())
        return servers[-1]

    yield make
    for s in servers:
        s.stop()


@pytest.fixture
def turns_started(engine):
    started: list = []

    def listen(ev):
        if isinstance(ev, TurnStarted):
            started.append(ev)

    engine.add_listener(listen)
    yield started
    engine.remove_listener(listen)


def chat_body(engine, text="Hello", max_tokens=2, **extra) -> bytes:
    return json.dumps(
        {
            "model": engine.loaded.name,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens,
            "temperature": 0,
            **extra,
        }
    ).encode()


def post(server: ApiServer, body: bytes, path="/v1/chat/completions", timeout=60):
    conn = http.client.HTTPConnection(*server.address, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()
    finally:
        conn.close()


def error_code(data: bytes) -> str:
    return json.loads(data)["error"]["code"]


def read_reply(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


# ---------------------------------------------------------------- bursts


@pytest.mark.slow
def test_forty_concurrent_clients_are_served_or_told_to_retry_never_reset(engine, serve):
    server = serve(max_pending=8)
    n = 40
    barrier = threading.Barrier(n)
    results: list = [None] * n

    def client(i):
        barrier.wait()
        try:
            status, headers, data = post(server, chat_body(engine, f"Client {i} says hello."))
            results[i] = (status, headers.get("Retry-After"), data)
        except OSError as exc:  # a reset or refused connection: what must not happen
            results[i] = exc

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    resets = [r for r in results if not isinstance(r, tuple)]
    assert resets == []
    assert all(status in (200, 429) for status, _, _ in results), [r[0] for r in results]
    ok = [r for r in results if r[0] == 200]
    assert ok and all(json.loads(d)["usage"]["completion_tokens"] == 2 for _, _, d in ok)
    for status, retry_after, data in results:
        if status == 429:
            assert int(retry_after) >= 1 and error_code(data) == "too_many_requests"


@pytest.mark.slow
def test_a_full_queue_answers_429_with_retry_after_and_frees_up(engine, serve):
    server = serve(max_pending=1)
    body = chat_body(engine, "Tell me a very long story.", max_tokens=30000, stream=True)
    with socket.create_connection(server.address, timeout=30) as hog:  # holds the only place
        hog.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        got = b""
        while got.count(b"data: ") < 2:
            chunk = hog.recv(4096)
            assert chunk, got
            got += chunk
        status, headers, data = post(server, chat_body(engine))
        assert status == 429 and int(headers["Retry-After"]) >= 1 and error_code(data) == "too_many_requests"
    # the hog hung up: its turn is stopped and its place given back
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        status, _, data = post(server, chat_body(engine))
        if status == 200:
            break
        time.sleep(0.05)  # the stopped turn ends between two tokens
    assert status == 200 and json.loads(data)["usage"]["completion_tokens"] == 2


# ---------------------------------------------------------------- slow clients


@pytest.mark.slow
def test_slow_loris_is_dropped_while_others_are_served(engine, serve):
    server = serve(client_timeout_s=1.0, head_timeout_s=1.0)
    closed = threading.Event()

    def trickle_headers():
        with socket.create_connection(server.address, timeout=10) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            try:
                for _ in range(100):  # one header byte every 0.2 s: a head that never ends
                    s.sendall(b"X")
                    s.settimeout(0.2)
                    try:
                        if s.recv(1024) == b"":
                            closed.set()
                            return
                    except TimeoutError:
                        pass
            except (BrokenPipeError, ConnectionResetError):
                closed.set()

    slow = threading.Thread(target=trickle_headers)
    slow.start()
    status, _, data = post(server, chat_body(engine, "Meanwhile, a normal question."))
    assert status == 200 and json.loads(data)["usage"]["completion_tokens"] == 2
    slow.join(30)
    assert closed.is_set(), "the slow client kept its connection"

    # a body that stops arriving: 408, and the connection is closed
    with socket.create_connection(server.address, timeout=10) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"messages": ['
        )
        reply = read_reply(s)
    assert reply.startswith(b"HTTP/1.1 408") and b"request_timeout" in reply


@pytest.mark.slow
def test_an_idle_connection_is_closed(serve):
    server = serve(client_timeout_s=1.0, head_timeout_s=1.0)
    with socket.create_connection(server.address, timeout=10) as s:
        assert s.recv(1) == b""  # closed by the server, not by our timeout


# ---------------------------------------------------------------- big and odd bodies


@pytest.mark.slow
def test_a_30_mb_body_is_refused_while_another_request_completes(engine, serve, turns_started):
    server = serve()
    size = 30 << 20
    with socket.create_connection(server.address, timeout=30) as big:
        big.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % size
        )
        big.sendall(b'{"messages": "' + b"x" * (1 << 20))  # in flight...
        status, _, data = post(server, chat_body(engine, "A small question."))  # ...while this one is served
        assert status == 200 and json.loads(data)["usage"]["completion_tokens"] == 2
        sent = (1 << 20) + 14
        while sent < size:
            n = min(1 << 20, size - sent)
            big.sendall(b"x" * n)
            sent += n
        reply = read_reply(big)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413") and error_code(body) == "body_too_large"
    assert len(turns_started) == 1  # only the small request reached the engine


@pytest.mark.slow
@pytest.mark.parametrize("where", ["top", "inside messages"])
def test_deeply_nested_json_is_a_400(engine, serve, where, turns_started):
    server = serve()
    deep = "[" * 100_000 + "]" * 100_000
    raw = deep if where == "top" else f'{{"messages": [{{"role": "user", "content": {deep}}}]}}'
    status, _, data = post(server, raw.encode())
    assert status == 400 and error_code(data) == "invalid_json"
    assert turns_started == []
    assert post(server, chat_body(engine))[0] == 200


@pytest.mark.slow
def test_an_unknown_model_is_404_model_not_found(engine, serve, turns_started):
    server = serve()
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert err.value.status_code == 404 and err.value.body["code"] == "model_not_found"
    assert err.value.body["param"] == "model" and "gpt-9" in err.value.body["message"]
    assert turns_started == []
    # the served name, and no name at all, are answered
    r = client.chat.completions.create(
        model=engine.loaded.name, messages=[{"role": "user", "content": "hi"}], max_tokens=2, temperature=0
    )
    assert r.usage.completion_tokens == 2
    assert [m.id for m in client.models.list().data] == [engine.loaded.name]


@pytest.mark.slow
def test_text_that_cannot_fit_never_reaches_the_model_thread(engine, serve, turns_started):
    server = serve()
    context = engine.loaded.context_tokens
    bound = server.meter.max_chars(engine.loaded)
    assert bound is not None and bound >= context
    over_bound = "word " * (bound // 5 + 1)  # refused on its length alone
    counted = "word " * (context * 2)  # short enough to count (off the model thread), too many tokens
    assert CHEAP_CHARS_PER_TOKEN * context < len(counted) <= bound  # the count is what refuses it
    for text in (over_bound, counted):
        status, _, data = post(server, chat_body(engine, text))
        assert status == 400 and error_code(data) == "context_length_exceeded", data[:200]
    assert turns_started == []
    assert post(server, chat_body(engine, "word " * 100))[0] == 200  # what fits is served


# ---------------------------------------------------------------- pictures are private and expire


def test_api_pictures_are_private_and_expire(tmp_path):
    folder = tmp_path / "pictures"
    store = PictureStore(folder, keep_s=60, max_age_s=3600)
    old, fresh = (Path(store_upload(store, picture_bytes(i), "p").path) for i in (1, 2))
    kept = store.path(store.put(picture_bytes(5), ".png"))  # the window's: never aged out here
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(old.stat().st_mode) == 0o600 and stat.S_IMODE(fresh.stat().st_mode) == 0o600
    legacy = folder / "00" / ("0" * 64 + ".png")  # left world-readable by an older version
    legacy.parent.mkdir()
    legacy.write_bytes(picture_bytes(3))
    os.chmod(legacy, 0o644)
    os.chmod(folder, 0o755)
    stale_tmp = old.parent / ".x.png.1.2.tmp"  # a crash mid-write
    stale_tmp.write_bytes(b"partial")
    day_ago = time.time() - 86400
    for p in (old, stale_tmp, kept):
        os.utime(p, (day_ago, day_ago))
    assert store.sweep() == 2
    assert not old.exists() and not stale_tmp.exists() and fresh.exists() and kept.exists()
    assert stat.S_IMODE(legacy.stat().st_mode) == 0o600 and stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert Path(store_upload(store, picture_bytes(1), "p").path).exists()  # sent again: stored again


@pytest.mark.slow
def test_server_start_sweeps_aged_pictures(engine, tmp_path):
    aged = Path(store_upload(PictureStore(tmp_path / "pictures"), picture_bytes(4), "p").path)
    long_ago = time.time() - 30 * 86400
    os.utime(aged, (long_ago, long_ago))
    legacy = tmp_path / "api-pictures"  # where older versions kept the API's pictures
    legacy.mkdir()
    (legacy / ("1" * 64 + ".png")).write_bytes(picture_bytes(6))
    server = ApiServer(engine, "127.0.0.1", 0, data_dir=tmp_path).start()
    try:
        assert not aged.exists() and not legacy.exists()
    finally:
        server.stop()
