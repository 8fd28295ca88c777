"""The remote engine against real servers on loopback: Parley's own `serve` in a second process
gives the same replies through the remote engine as through a bare `openai` client, streamed or
not; re-sent turns are cached on the server; each way a server can fail is one clear sentence
and the engine keeps working."""
from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading

import pytest

from engine.client import EngineError, load_blocking, run_blocking
from engine.events import Message, ModelReady, Sampling, Token, Turn, TurnDone, TurnFailed
from engine.remote import RemoteConfig, RemoteConfigError, RemoteEngine, normalize_base_url
from tests.fixtures.pictures import make_picture
from tests.remote_servers import (
    ROOT, DropsMidStream, Forbidden, NeverAnswers, ParleyServe, PlainWebsite, Strict, StubServer, Unauthorized, free_port,
)

openai = pytest.importorskip("openai")

N = 6  # tokens per reply


# ---------------------------------------------------------------- no server needed

@pytest.mark.parametrize("pasted, base", [
    ("http://gpu-box:8000", "http://gpu-box:8000/v1"),
    ("http://gpu-box:8000/", "http://gpu-box:8000/v1"),
    ("http://gpu-box:8000/v1", "http://gpu-box:8000/v1"),
    ("http://gpu-box:8000/v1/", "http://gpu-box:8000/v1"),
    ("gpu-box:8000", "http://gpu-box:8000/v1"),
    ("https://api.example.org/v1/chat/completions", "https://api.example.org/v1"),
    ("http://host/proxy/openai", "http://host/proxy/openai/v1"),
])
def test_base_url_with_or_without_v1(pasted, base):
    assert normalize_base_url(pasted) == base


@pytest.mark.parametrize("bad, why", [("", "No server address"), ("ftp://host", "http:// or https://"),
                                      ("http://host:port", "bad port"), ("http://:80", "no host")])
def test_bad_base_url_is_one_sentence(bad, why):
    with pytest.raises(RemoteConfigError, match=why):
        normalize_base_url(bad)


# ---------------------------------------------------------------- Parley's own serve

@pytest.fixture(scope="module")
def parley(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("remote")
    server = ParleyServe(tiny_model("llava"), root / "server-data")
    server.root = root
    yield server
    server.close()


def remote(url: str, **kw) -> RemoteEngine:
    return RemoteEngine(RemoteConfig.make(url, **kw)).start()


def data_url(path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def as_openai(messages: list[Message]) -> list[dict]:
    out = []
    for m in messages:
        if m.images:
            out.append({"role": m.role, "content": [{"type": "image_url", "image_url": {"url": data_url(p)}}
                                                    for p in m.images] + [{"type": "text", "text": m.text}]})
        else:
            out.append({"role": m.role, "content": m.text})
    return out


def three_turns(engine, pictures, cid: str) -> list[TurnDone]:
    a, b = pictures
    asks = [("What is in this picture?", [a]), ("And this one?", [b]), ("Which of them is brighter?", [])]
    history: list[Message] = []
    done = []
    for text, pics in asks:
        history.append(Message("user", text, list(pics)))
        r = run_blocking(engine, Turn(cid, list(history), Sampling(max_new_tokens=N)), timeout=300)
        assert isinstance(r, TurnDone), r
        history.append(Message("assistant", r.reply))
        done.append(r)
    return done


@pytest.fixture(scope="module")
def pictures(parley):
    return make_picture(parley.root / "a.png", 1), make_picture(parley.root / "b.png", 2)


@pytest.mark.slow
def test_three_turns_same_text_as_a_bare_client_streamed_or_not(parley, pictures):
    streamed = remote(parley.url)
    whole = RemoteEngine(RemoteConfig.make(parley.url, stream=False)).start()
    try:
        ready = load_blocking(streamed, "")
        assert ready.name and ready.family == "remote"
        turns = three_turns(streamed, pictures, "s")
        again = three_turns(whole, pictures, "w")
    finally:
        streamed.shutdown()
        whole.shutdown()
    client = openai.OpenAI(base_url=parley.url, api_key="x", max_retries=0, timeout=300)
    history: list[Message] = []
    for r, (text, pics) in zip(turns, [("What is in this picture?", [pictures[0]]),
                                       ("And this one?", [pictures[1]]), ("Which of them is brighter?", [])]):
        history.append(Message("user", text, list(pics)))
        direct = client.chat.completions.create(model=ready.name, messages=as_openai(history),
                                                max_tokens=N, temperature=0)
        assert r.reply == direct.choices[0].message.content
        history.append(Message("assistant", r.reply))
    assert [t.reply for t in turns] == [t.reply for t in again]  # streaming == non-streaming
    for i, t in enumerate(turns):
        s = t.stats
        assert s.engine == "remote" and s.generated_tokens == N and s.prompt_tokens > 0
        assert s.ttft_s > 0 and s.decode_s >= 0 and s.usage_reported
        if i:  # the server reused the conversation's prefix and re-sent pictures never woke its encoder
            assert s.cached_tokens > 0
            assert s.server_gate["encoder_loads"] == 0 and s.server_gate["image_cache_hits"] >= 1
    assert turns[0].stats.server_gate["pictures_encoded"] == 1


@pytest.mark.slow
def test_400_too_many_pictures_from_parley_serve(parley, pictures):
    engine = remote(parley.url)
    try:
        r = fail_turn(engine, [Message("user", "Compare them all.", [str(pictures[0])] * 17)])
        assert "rejected the request (400): Too many pictures: at most 16 per request" in r.message
        ok = run_blocking(engine, Turn("c", [Message("user", "hi")], Sampling(max_new_tokens=2)), timeout=300)
        assert isinstance(ok, TurnDone)  # the next turn is fine
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_stop_mid_stream_closes_the_request(parley, pictures):
    engine = remote(parley.url)
    got = threading.Event()
    pieces: list[str] = []

    def on_token(ev: Token):
        pieces.append(ev.text)
        engine.stop(ev.turn_id)
        got.set()

    try:
        r = run_blocking(engine, Turn("stop", [Message("user", "Tell me a long story.")],
                                      Sampling(max_new_tokens=400)), on_token=on_token, timeout=300)
        assert isinstance(r, TurnDone) and r.stopped and got.is_set()
        assert r.reply == "".join(pieces) and len(pieces) < 400
        # the server let go of the stopped request: the next turn is answered in full
        after = run_blocking(engine, Turn("after", [Message("user", "hi")], Sampling(max_new_tokens=3)), timeout=300)
        assert isinstance(after, TurnDone) and after.stats.generated_tokens == 3
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_headless_ask_and_replay_against_a_server(parley, pictures, tmp_path):
    url_without_v1 = parley.url[: -len("/v1")]
    client = openai.OpenAI(base_url=parley.url, api_key="x", max_retries=0, timeout=300)
    name = client.models.list().data[0].id
    direct = client.chat.completions.create(
        model=name, messages=as_openai([Message("user", "Describe it.", [pictures[0]])]), max_tokens=N, temperature=0)
    ask = subprocess.run([sys.executable, str(ROOT / "main.py"), "ask", "--remote", url_without_v1, "--model", name,
                          "--image", str(pictures[0]), "--max-new-tokens", str(N), "Describe it."],
                         capture_output=True, text=True, timeout=300)
    assert ask.returncode == 0, ask.stderr
    assert ask.stdout == direct.choices[0].message.content + "\n"
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"settings": {"max_new_tokens": N}, "turns": [
        {"user": "Describe it.", "images": [str(pictures[0])]}, {"user": "Again, shorter."}]}))
    rep = subprocess.run([sys.executable, str(ROOT / "main.py"), "replay", "--remote", parley.url + "/",
                          "--model", name, str(script)], capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr
    lines = [json.loads(x) for x in rep.stdout.splitlines()]
    assert lines[0]["reply"] == direct.choices[0].message.content
    for line in lines:
        assert {"prompt_tokens", "generated_tokens", "cached_tokens", "ttft_s", "decode_s"} <= set(line["stats"])
    assert lines[1]["stats"]["cached_tokens"] > 0


def test_headless_ask_with_nothing_listening_says_so():
    port = free_port()
    r = subprocess.run([sys.executable, str(ROOT / "main.py"), "ask", "--remote", f"127.0.0.1:{port}",
                        "--model", "m", "hi"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [f"error: Cannot reach the server at http://127.0.0.1:{port}: "
                                             "connection refused (is the server running on that port?)."]


# ---------------------------------------------------------------- failures, each with a real socket

@pytest.fixture
def stub(request):
    servers = []

    def start(handler):
        servers.append(StubServer(handler))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def fail_turn(engine: RemoteEngine, messages=None) -> TurnFailed:
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


def check(url: str, expected: str, model: str = "big-vlm", messages=None, **kw) -> TurnFailed:
    engine = remote(url, model=model, **kw)
    try:
        r = fail_turn(engine, messages)
        assert expected in r.message, r.message
        assert engine.report.last_error == r.message
        return r
    finally:
        engine.shutdown()


def test_nothing_listening():
    port = free_port()
    engine = remote(f"http://127.0.0.1:{port}")
    try:
        with pytest.raises(EngineError, match="connection refused"):
            load_blocking(engine, "")
        assert "connection refused" in fail_turn(engine).message
    finally:
        engine.shutdown()


def test_dns_failure():
    check("http://parley-no-such-host.invalid:8000", "host name does not resolve")


def test_tls_to_a_plain_http_server(stub):
    s = stub(PlainWebsite)
    check(s.root.replace("http://", "https://"), "TLS error")


def test_401(stub):
    check(stub(Unauthorized).root, "refused the API key (401): Invalid API key. Check the key in Settings.")


def test_403(stub):
    check(stub(Forbidden).root, "denied access (403): This key may not use big-vlm.")


def test_404_model_is_named_with_what_the_server_offers(stub):
    check(stub(Strict).root, "has no model named 'retired-vlm' (it offers: big-vlm)", model="retired-vlm")


def test_404_from_the_chat_endpoint(stub):
    engine = remote(stub(Strict).root, model="big-vlm")
    try:
        load_blocking(engine, "")
        engine.model_name = "gone-since"  # the server unloaded the model after we connected
        r = fail_turn(engine)
        assert "has no model named" in r.message and "does not exist" in r.message
    finally:
        engine.shutdown()


def test_413_too_many_pictures(stub, tmp_path):
    pics = [str(make_picture(tmp_path / f"p{i}.png", i, size=(96, 96))) for i in range(3)]
    r = check(stub(Strict).root, "refused the request as too large (413)",
              messages=[Message("user", "compare", pics)])
    assert "fewer or smaller pictures" in r.message


def test_plain_web_server_is_not_an_api(stub):
    s = stub(PlainWebsite)
    engine = remote(s.root, model="x")
    try:
        with pytest.raises(EngineError, match="not an OpenAI-compatible API"):
            load_blocking(engine, "")
        assert "not an OpenAI-compatible API" in fail_turn(engine).message
    finally:
        engine.shutdown()


def test_timeout(stub):
    check(stub(NeverAnswers).root, "did not answer within 1 s", timeout_s=1.0)


def test_stream_dropped_mid_reply_keeps_the_partial_reply(stub):
    engine = remote(stub(DropsMidStream).root, model="big-vlm")
    seen: list[str] = []
    try:
        r = run_blocking(engine, Turn("c", [Message("user", "hi")]), on_token=lambda ev: seen.append(ev.text),
                         timeout=60)
        assert isinstance(r, TurnFailed)
        assert r.partial == "Half a reply" == "".join(seen)
        assert "dropped mid-reply; the partial reply is kept" in r.message
    finally:
        engine.shutdown()


def test_unreadable_picture_fails_the_turn_alone(tmp_path, stub):
    s = stub(Strict)
    r = check(s.root, "Picture not found", messages=[Message("user", "look", [str(tmp_path / "gone.png")])])
    assert r.partial == ""


# ---------------------------------------------------------------- transformers serve

@pytest.mark.slow
def test_transformers_serve_same_text_as_a_bare_client(tiny_model, tmp_path):
    pytest.importorskip("fastapi", reason="transformers serve needs transformers[serving] (requirements-dev.txt)")
    from tests.remote_servers import TransformersServe

    server = TransformersServe(tiny_model("llava"))
    pics = make_picture(tmp_path / "a.png", 1), make_picture(tmp_path / "b.png", 2)
    try:
        streamed = remote(server.url, model=server.model)
        whole = RemoteEngine(RemoteConfig.make(server.url, model=server.model, stream=False)).start()
        try:
            turns = three_turns(streamed, pics, "s")
            again = three_turns(whole, pics, "w")
            got = threading.Event()

            def on_token(ev):
                streamed.stop(ev.turn_id)
                got.set()

            stopped = run_blocking(streamed, Turn("x", [Message("user", "Go on and on.")], Sampling(max_new_tokens=300)),
                                   on_token=on_token, timeout=300)
            assert isinstance(stopped, TurnDone) and stopped.stopped and got.is_set()
        finally:
            streamed.shutdown()
            whole.shutdown()
        client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=300)
        history: list[Message] = []
        for r, (text, p) in zip(turns, [("What is in this picture?", [pics[0]]), ("And this one?", [pics[1]]),
                                        ("Which of them is brighter?", [])]):
            history.append(Message("user", text, list(p)))
            direct = client.chat.completions.create(model=server.model, messages=as_openai(history),
                                                    max_tokens=N, temperature=0)
            assert r.reply == direct.choices[0].message.content
            history.append(Message("assistant", r.reply))
        assert [t.reply for t in turns] == [t.reply for t in again]
        assert all(t.stats.generated_tokens == N and t.stats.prompt_tokens > 0 for t in turns)
    finally:
        server.close()


@pytest.mark.slow
def test_stop_ends_the_request_on_the_server(tiny_model, tmp_path):
    """Parley's server in this process (a real socket still) so its engine can be watched: the
    stopped stream ends the server's turn early, it does not run on to max_tokens."""
    from engine.api import ApiServer
    from tests.engine_helpers import open_engine

    server_engine = open_engine(tiny_model("llava"), tmp_path / "server")
    ended = threading.Event()
    server_turns: list[TurnDone] = []

    def watch(ev):
        if isinstance(ev, TurnDone):
            server_turns.append(ev)
            ended.set()

    server_engine.add_listener(watch)
    api = ApiServer(server_engine, "127.0.0.1", 0).start()
    engine = remote(api.url)
    try:
        r = run_blocking(engine, Turn("c", [Message("user", "Tell me everything.")], Sampling(max_new_tokens=400)),
                         on_token=lambda ev: engine.stop(ev.turn_id), timeout=300)
        assert isinstance(r, TurnDone) and r.stopped
        assert ended.wait(60)
        assert server_turns[0].stopped and len(server_turns[0].token_ids) < 400
    finally:
        engine.shutdown()
        api.stop()
        server_engine.shutdown()


def test_picture_data_urls_are_the_original_bytes_and_follow_the_file(tmp_path):
    from engine.picture_file import PictureError
    from engine.remote.messages import DataUrlCache, chat_messages

    pic = make_picture(tmp_path / "p", 1, fmt="JPEG")  # no extension, as in Parley's history
    turn = Turn("c", [Message("user", "look", [str(pic)])], system_prompt="Be brief.")
    msgs = chat_messages(turn)
    assert msgs[0] == {"role": "system", "content": "Be brief."}
    url = msgs[1]["content"][0]["image_url"]["url"]
    assert url.startswith("data:image/jpeg;base64,") and base64.b64decode(url.split(",", 1)[1]) == pic.read_bytes()
    assert msgs[1]["content"][1] == {"type": "text", "text": "look"}
    cache = DataUrlCache(max_bytes=1)
    first = cache.get(str(pic))
    make_picture(pic, 2, size=(80, 60), fmt="PNG")  # the file changed: never the old bytes
    assert cache.get(str(pic)) != first and cache.get(str(pic)).startswith("data:image/png;base64,")
    (tmp_path / "notes.txt").write_text("not a picture")
    with pytest.raises(PictureError, match="notes.txt is not a picture"):
        cache.get(str(tmp_path / "notes.txt"))
