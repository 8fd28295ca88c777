"""The OpenAI-compatible API on the running engine: the real `openai` client gets the engine's
own greedy replies, re-sent conversations reuse the KV prefix and the image cache, every bad
request gets a clean 4xx without disturbing the engine, and a vanished client stops its turn."""
from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import blake3
import pytest

from engine.api import ApiConfigError, ApiServer, check_bind
from engine.api.stops import StopScanner
from engine.events import Message, Token, TurnDone, TurnStarted
from tests.engine_helpers import Reference, ask, expect_done, open_engine
from tests.fixtures.pictures import make_broken_picture, make_not_a_picture, make_picture

openai = pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- helpers

def data_url(path: Path, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(Path(path).read_bytes()).decode()


def user(text: str, *pictures: Path) -> dict:
    if not pictures:
        return {"role": "user", "content": text}
    return {"role": "user", "content": [{"type": "text", "text": text}]
            + [{"type": "image_url", "image_url": {"url": data_url(p)}} for p in pictures]}


class Served:
    def __init__(self, model_dir: Path, root: Path):
        self.model_dir = model_dir
        self.root = root
        self.engine = open_engine(model_dir, root / "data")
        self.activity: list[dict] = []
        self.server = ApiServer(self.engine, "127.0.0.1", 0, on_activity=self.activity.append).start()
        self.client = openai.OpenAI(base_url=self.server.url, api_key="unused", max_retries=0, timeout=60)
        self._ref = None

    @property
    def ref(self) -> Reference:
        if self._ref is None:
            self._ref = Reference(self.model_dir)
        return self._ref

    def ref_text(self, messages: list[Message], n: int) -> tuple[str, list[int]]:
        ids = self.ref.reply_ids(messages, n)
        return self.ref.loaded.tokenizer.decode(ids, skip_special_tokens=True), ids

    def chat(self, messages, **kw):
        kw.setdefault("max_tokens", 6)
        kw.setdefault("temperature", 0)
        return self.client.chat.completions.create(model=self.model, messages=messages, **kw)

    @property
    def model(self) -> str:
        return self.engine.loaded.name  # the served model's id (another name is a 404)

    def raw(self, method: str, path: str, body: bytes | str | None = None, headers: dict | None = None,
            server: ApiServer | None = None):
        host, port = (server or self.server).address
        conn = http.client.HTTPConnection(host, port, timeout=60)
        try:
            if isinstance(body, str):
                body = body.encode()
            hdrs = {"Content-Type": "application/json"}
            hdrs.update(headers or {})
            chunked = body is not None and not isinstance(body, bytes)  # an iterator: sent chunked
            conn.request(method, path, body=body, headers=hdrs, encode_chunked=chunked)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, resp.headers, data  # header names are case-insensitive
        finally:
            conn.close()

    def close(self):
        self.server.stop()
        self.engine.shutdown()


@pytest.fixture(scope="module")
def served(tiny_model, tmp_path_factory):
    s = Served(tiny_model("llava"), tmp_path_factory.mktemp("api"))
    yield s
    s.close()


def assert_good_request_works(served: Served):
    r = served.chat([user("Still there?")], max_tokens=2)
    assert r.choices[0].message.role == "assistant" and r.usage.completion_tokens == 2


# ---------------------------------------------------------------- no model needed

@pytest.mark.parametrize("stops, pieces, sent, hit", [
    (["END"], ["ab", "cE", "N", "Dxx"], "abc", True),
    (["END"], ["ab", "cE", "N", "x"], "abcENx", False),
    (["\n\n", "##"], ["a\n", "b#", "#c"], "a\nb", True),
    (["x"], ["x"], "", True),
    ([], ["a", "b"], "ab", False),
    (["lo w", "o"], ["hel", "lo world"], "hel", True),  # the earliest stop wins
])
def test_stop_scanner_releases_only_safe_text(stops, pieces, sent, hit):
    sc = StopScanner(stops)
    out = "".join(sc.push(p) for p in pieces)
    if not sc.hit:
        out += sc.flush()
    assert out == sent and sc.text == sent and sc.hit == hit


def test_picture_store_is_content_addressed_validated_and_capped(tmp_path):
    from engine.api import ApiError
    from engine.api.pictures import PictureStore
    from tests.fixtures.pictures import picture_bytes

    store = PictureStore(tmp_path / "pics", max_bytes=1, keep_s=0)
    a, b = picture_bytes(1), picture_bytes(2, fmt="JPEG")
    pa = store.put(a, "p")
    assert pa.name == blake3.blake3(a).hexdigest() + ".png" and pa.read_bytes() == a
    assert store.put(a, "p") == pa  # same bytes, same file
    pb = store.put(b, "p")
    assert pb.suffix == ".jpg" and pb.exists()
    assert not pa.exists() and store.pruned == 1  # over the cap: the older picture went, the new one stays
    assert store.put(a, "p").exists()  # and comes back when sent again
    with pytest.raises(ApiError) as err:
        store.put(b"%PDF-1.4 not a picture", "messages[0].content[1]")
    assert err.value.status == 400 and err.value.param == "messages[0].content[1]"
    kept = PictureStore(tmp_path / "kept", max_bytes=1)  # recently used pictures are never pruned
    p1, p2 = kept.put(a, "p"), kept.put(b, "p")
    assert p1.exists() and p2.exists()
    assert not list((tmp_path / "pics").glob(".*.tmp"))


def test_network_bind_without_token_is_refused():
    for host in ("0.0.0.0", "", "::"):
        with pytest.raises(ApiConfigError, match="Refusing to serve the API"):
            check_bind(host, None)
    with pytest.raises(ApiConfigError, match="token"):
        check_bind("0.0.0.0", "")
    check_bind("127.0.0.1", None)
    check_bind("localhost", None)
    check_bind("::1", None)
    check_bind("0.0.0.0", "s3cret")


# ---------------------------------------------------------------- replies

@pytest.mark.slow
def test_models_lists_the_loaded_model(served):
    models = served.client.models.list()
    assert [m.id for m in models.data] == [served.engine.loaded.name]
    assert served.client.models.retrieve(served.engine.loaded.name).id == served.engine.loaded.name
    # chat clients enable their picture button from these (Ollama- and OpenRouter-style fields)
    listed = models.data[0].model_dump()
    assert "vision" in listed["capabilities"]
    assert "image" in listed["architecture"]["input_modalities"]


@pytest.mark.slow
def test_replies_equal_the_engines_greedy_reply(served, tmp_path):
    pic = make_picture(tmp_path / "p.png", 11)
    convo = [user("What is in this picture?", pic)]
    want, ids = served.ref_text([Message("user", "What is in this picture?", [str(pic)])], 8)
    r = served.chat(convo, max_tokens=8)
    assert r.choices[0].message.content == want
    assert r.usage.completion_tokens == len(ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.choices[0].finish_reason == ("length" if len(ids) == 8 else "stop")
    assert r.model == served.engine.loaded.name

    chunks = list(served.chat(convo, max_tokens=8, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [r.choices[0].finish_reason]
    usage = chunks[-1].usage
    assert usage.completion_tokens == len(ids)
    assert usage.prompt_tokens_details.cached_tokens > 0  # the same conversation again: its prefix is hot

    # the picture is stored once, under its content hash, with the client's bytes
    stored = served.root / "data" / "api-pictures" / (blake3.blake3(pic.read_bytes()).hexdigest() + ".png")
    assert stored.read_bytes() == pic.read_bytes()


@pytest.mark.slow
def test_sampling_settings_are_honoured(served):
    convo = [user("Tell me something.")]
    kw = dict(max_tokens=12, temperature=0.9, top_p=0.8, seed=1234)
    a = served.chat(convo, **kw).choices[0].message.content
    b = served.chat(convo, **kw).choices[0].message.content
    assert a == b  # seeded sampling repeats
    r = served.chat(convo, max_completion_tokens=3)
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"


@pytest.mark.slow
def test_stop_sequences_cut_the_reply_and_stop_generation(served):
    msgs = [Message("user", "Say something long.")]
    full, _ = served.ref_text(msgs, 20)
    assert len(full) > 8
    stop = full[4:7]
    want = full[:full.index(stop)]
    done: list[TurnDone] = []
    ended = threading.Event()
    served.engine.add_listener(lambda ev: (done.append(ev), ended.set()) if isinstance(ev, TurnDone) else None)
    r = served.chat([user("Say something long.")], max_tokens=20, stop=[stop, "never-there"])
    assert r.choices[0].message.content == want and r.choices[0].finish_reason == "stop"
    assert ended.wait(30)  # the reply is sent at the stop string; the engine ends its turn right after
    assert done[-1].stopped and len(done[-1].token_ids) < 20  # the engine stopped early
    chunks = list(served.chat([user("Say something long.")], max_tokens=20, stop=stop, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"


# ---------------------------------------------------------------- re-sent conversations

@pytest.mark.slow
def test_resent_picture_conversation_reuses_prefix_and_image_cache(served, tmp_path):
    """Turn N re-sends the whole conversation: only the new part is prefilled, and the re-sent
    picture never wakes the encoder (it is in the reused prefix, or an image-cache hit)."""
    engine = served.engine
    pic = make_picture(tmp_path / "resent.png", 21)
    msgs = [Message("user", "Describe this picture.", [str(pic)])]
    convo = [user("Describe this picture.", pic)]
    reply = served.chat(convo).choices[0].message.content
    assert engine.last_turn_stats.pictures_encoded == 1
    for text, pics in [("And the colours?", []), ("Compare it with this one again.", [pic])]:
        engine.unload_encoder()  # not resident: any need for the encoder would show as a load
        convo += [{"role": "assistant", "content": reply}, user(text, *pics)]
        msgs += [Message("assistant", reply), Message("user", text, [str(p) for p in pics])]
        loads = engine.gate.residency.loads
        r = served.chat(convo)
        s = engine.last_turn_stats
        cached = r.usage.prompt_tokens_details.cached_tokens
        assert cached > 0 and cached == s.reused_tokens + s.restored_tokens
        assert s.prefill_tokens == r.usage.prompt_tokens - cached
        assert s.encoder_loads == 0 and engine.gate.residency.loads == loads
        assert s.encoder_resident is False and s.pictures_encoded == 0 and s.image_cache_misses == 0
        reply = r.choices[0].message.content
        assert reply == served.ref_text(msgs, 6)[0]  # exact: same as a fresh full prefill
    assert s.image_cache_hits == 2  # turn 3: both copies of the picture were looked up, both hits
    assert s.prefill_tokens < s.prompt_tokens // 2


# ---------------------------------------------------------------- bad requests

def _big_picture_count(pic: Path, n: int, model: str) -> dict:
    return {"model": model, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(pic)}}] * n}]}


def _bad_cases(tmp: Path, model: str):
    good = make_picture(tmp / "good.png", 3)
    pdf = make_not_a_picture(tmp / "doc.pdf")
    broken = make_broken_picture(tmp / "broken.png")
    ok_msgs = [{"role": "user", "content": "hi"}]

    def chat(**body):
        body.setdefault("model", model)
        return ("POST", "/v1/chat/completions", json.dumps(body))

    def img(url):
        return chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}])

    return [
        ("malformed json", ("POST", "/v1/chat/completions", "{not json"), 400, "invalid_json"),
        ("not utf-8", ("POST", "/v1/chat/completions", b"\xff\xfe{"), 400, "invalid_json"),
        ("body is a list", ("POST", "/v1/chat/completions", "[]"), 400, "invalid_type"),
        ("missing messages", chat(), 400, "missing_messages"),
        ("empty messages", chat(messages=[]), 400, "empty_messages"),
        ("messages not a list", chat(messages="hi"), 400, "invalid_type"),
        ("message not an object", chat(messages=["hi"]), 400, "invalid_type"),
        ("unknown role", chat(messages=[{"role": "wizard", "content": "hi"}]), 400, "invalid_role"),
        ("tool role", chat(messages=[{"role": "tool", "content": "hi"}]), 400, "unsupported_role"),
        ("content a number", chat(messages=[{"role": "user", "content": 5}]), 400, "invalid_type"),
        ("missing content", chat(messages=[{"role": "user"}]), 400, "missing_content"),
        ("unknown part", chat(messages=[{"role": "user", "content": [{"type": "input_audio"}]}]), 400,
         "unsupported_content"),
        ("ends with assistant", chat(messages=ok_msgs + [{"role": "assistant", "content": "x"}]), 400,
         "invalid_value"),
        ("bad base64", img("data:image/png;base64,@@not base64@@"), 400, "invalid_base64"),
        ("not a picture", img(data_url(pdf)), 400, "invalid_image"),
        ("damaged picture", img(data_url(broken)), 400, "invalid_image"),
        ("pdf data url", img(data_url(pdf, "application/pdf")), 400, "invalid_image"),
        ("remote image", img("https://example.com/cat.png"), 400, "remote_image_refused"),
        ("file url", img("file:///etc/passwd"), 400, "invalid_image_url"),
        ("too many pictures", ("POST", "/v1/chat/completions", json.dumps(_big_picture_count(good, 17, model))), 400,
         "too_many_pictures"),
        ("max_tokens a string", chat(messages=ok_msgs, max_tokens="ten"), 400, "invalid_value"),
        ("max_tokens zero", chat(messages=ok_msgs, max_tokens=0), 400, "invalid_value"),
        ("temperature too high", chat(messages=ok_msgs, temperature=5), 400, "invalid_value"),
        ("top_p a string", chat(messages=ok_msgs, top_p="high"), 400, "invalid_value"),
        ("stream a string", chat(messages=ok_msgs, stream="yes"), 400, "invalid_type"),
        ("stop a number", chat(messages=ok_msgs, stop=5), 400, "invalid_type"),
        ("seed a float", chat(messages=ok_msgs, seed=1.5), 400, "invalid_type"),
        ("n two", chat(messages=ok_msgs, n=2), 400, "unsupported_value"),
        ("model a number", chat(messages=ok_msgs, model=3), 400, "invalid_type"),
        ("body too large", ("POST", "/v1/chat/completions", b" " * ((32 << 20) + 1)), 413, "body_too_large"),
        ("unknown path", ("POST", "/v1/completions", "{}"), 404, "not_found"),
        ("unknown root path", ("GET", "/", None), 404, "not_found"),
        ("unknown model", ("GET", "/v1/models/gpt-9", None), 404, "model_not_found"),
        ("GET on chat", ("GET", "/v1/chat/completions", None), 405, "method_not_allowed"),
        ("DELETE on models", ("DELETE", "/v1/models", None), 405, "method_not_allowed"),
        ("CORS preflight", ("OPTIONS", "/v1/chat/completions", None), 405, "method_not_allowed"),
        ("chunked upload", ("POST", "/v1/chat/completions", iter([b'{"messages": []}'])), 411, "length_required"),
    ]


@pytest.mark.slow
def test_bad_requests_get_clean_4xx_and_leave_the_engine_serving(served, tmp_path):
    started: list = []
    def listen(ev):
        if isinstance(ev, TurnStarted):
            started.append(ev)

    served.engine.add_listener(listen)
    for name, (method, path, body), status, code in _bad_cases(tmp_path, served.model):
        got, headers, data = served.raw(method, path, body)
        assert got == status, (name, data[:300])
        err = json.loads(data)["error"]
        assert set(err) == {"message", "type", "param", "code"}, name
        assert err["code"] == code and err["message"], (name, err)
        assert err["type"] == "invalid_request_error", name
        if status == 405:
            assert headers.get("Allow"), name
        if name == "remote image":
            assert "Parley does not fetch remote images" in err["message"]
    served.engine.remove_listener(listen)
    assert started == []  # no bad request reached the engine
    assert served.engine.running
    assert_good_request_works(served)
    # the openai client sees the same errors as exceptions
    with pytest.raises(openai.BadRequestError) as exc:
        served.chat([{"role": "wizard", "content": "hi"}])
    assert exc.value.body["code"] == "invalid_role"
    assert_good_request_works(served)


@pytest.mark.slow
def test_web_pages_and_rebinding_hosts_are_refused_without_a_token(served):
    status, _, data = served.raw("GET", "/v1/models", headers={"Host": "evil.example:8011"})
    assert status == 403 and json.loads(data)["error"]["code"] == "host_not_allowed"
    status, _, data = served.raw("POST", "/v1/chat/completions", json.dumps({"messages": [user("hi")]}),
                                 headers={"Origin": "https://evil.example"})
    assert status == 403 and json.loads(data)["error"]["code"] == "origin_not_allowed"
    status, _, _ = served.raw("GET", "/v1/models",
                              headers={"Host": "localhost:8011", "Origin": "http://127.0.0.1:3000"})
    assert status == 200


@pytest.mark.slow
def test_token_is_required_when_set(served):
    with pytest.raises(ApiConfigError, match="Refusing"):
        ApiServer(served.engine, "0.0.0.0", 0)
    secured = ApiServer(served.engine, "127.0.0.1", 0, token="s3cret-token").start()
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-token"},
                        {"Authorization": "Basic s3cret-token"}):
            status, hdrs, data = served.raw("GET", "/v1/models", headers=headers, server=secured)
            assert status == 401, headers
            assert json.loads(data)["error"]["code"] == "invalid_api_key"
            assert hdrs.get("WWW-Authenticate", "").startswith("Bearer")
        status, _, _ = served.raw("POST", "/v1/chat/completions", json.dumps({"messages": [user("hi")]}),
                                  server=secured)
        assert status == 401
        bad_client = openai.OpenAI(base_url=secured.url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad_client.models.list()
        good = openai.OpenAI(base_url=secured.url, api_key="s3cret-token", max_retries=0)
        r = good.chat.completions.create(model=served.model, messages=[user("hi")], max_tokens=2, temperature=0)
        assert r.usage.completion_tokens == 2
    finally:
        secured.stop()
    # with a token a network bind is allowed
    wide = ApiServer(served.engine, "0.0.0.0", 0, token="s3cret-token")
    wide.stop()
    assert_good_request_works(served)


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
    body = json.dumps({"model": served.model, "messages": [user(f"Tell me a very long story ({stream}).")],
                       "max_tokens": 30000, "temperature": 0, "stream": stream}).encode()
    host, port = served.server.address
    sock = socket.create_connection((host, port), timeout=30)
    try:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
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
        sock.sendall(b"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body.encode()))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"chunked" not in head.lower()
    events = [line[6:] for line in payload.decode().split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert text == served.ref_text([Message("user", "Hello there")], 4)[0]


# ---------------------------------------------------------------- sharing the engine

@pytest.mark.slow
def test_api_and_window_turns_share_the_queue(served):
    engine = served.engine
    results: dict = {}
    questions = ["First client asks.", "Second client asks something else."]

    def client(i):
        results[i] = served.chat([user(questions[i])], max_tokens=5).choices[0].message.content

    threads = [threading.Thread(target=client, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    window = expect_done(ask(engine, "window-1", [Message("user", "The window's question.")], 5))
    for t in threads:
        t.join(60)
    assert window.token_ids == served.ref.reply_ids([Message("user", "The window's question.")], 5)
    for i, q in enumerate(questions):
        assert results[i] == served.ref_text([Message("user", q)], 5)[0]
    snap = served.server.activity.snapshot()
    assert snap["active"] == 0 and snap["requests"] >= 2 and snap["last_client"] == "127.0.0.1"
    assert served.activity and served.activity[-1]["active"] == 0


# ---------------------------------------------------------------- the `serve` command

@pytest.mark.slow
def test_serve_command(tiny_model, tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    refused = subprocess.run([sys.executable, str(ROOT / "main.py"), "serve", "--host", "0.0.0.0", "--port", "0",
                              "--data-dir", str(tmp_path / "d")], capture_output=True, text=True, env=env,
                             timeout=120)
    assert refused.returncode != 0 and "--api-token" in refused.stderr
    proc = subprocess.Popen([sys.executable, str(ROOT / "main.py"), "serve", "--port", "0",
                             "--model", str(tiny_model("llava")), "--data-dir", str(tmp_path / "d")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert "http://127.0.0.1:" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        url = line[line.index("http://"):].split()[0]
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
        model = client.models.list().data[0].id
        r = client.chat.completions.create(model=model, messages=[user("hi")], max_tokens=2, temperature=0)
        assert r.usage.completion_tokens == 2
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert rc == 0
