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
from pathlib import Path

import pytest

from engine.protocol.client import load_blocking, run_blocking
from engine.protocol.events import Message, Sampling, Token, Turn, TurnDone
from engine.remote import RemoteConfig, RemoteConfigError, RemoteEngine, normalize_base_url
from tests.fixtures.pictures import make_picture, pics as picture_refs
from tests.helpers.remote_servers import ROOT, ParleyServe, fail_turn, free_port, remote

openai = pytest.importorskip("openai")

N = 6  # tokens per reply


# ---------------------------------------------------------------- no server needed


@pytest.mark.parametrize(
    "pasted, base",
    [
        ("http://gpu-box:8000", "http://gpu-box:8000/v1"),
        ("http://gpu-box:8000/", "http://gpu-box:8000/v1"),
        ("http://gpu-box:8000/v1", "http://gpu-box:8000/v1"),
        ("http://gpu-box:8000/v1/", "http://gpu-box:8000/v1"),
        ("gpu-box:8000", "http://gpu-box:8000/v1"),
        ("https://api.example.org/v1/chat/completions", "https://api.example.org/v1"),
        ("http://host/proxy/openai", "http://host/proxy/openai/v1"),
    ],
)
def test_base_url_with_or_without_v1(pasted, base):
    assert normalize_base_url(pasted) == base


@pytest.mark.parametrize(
    "bad, why",
    [
        ("", "No server address"),
        ("ftp://host", "http:// or https://"),
        ("http://host:port", "bad port"),
        ("http://:80", "no host"),
    ],
)
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


def data_url(path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def as_openai(messages: list[Message]) -> list[dict]:
    out = []
    for m in messages:
        if m.images:
            out.append(
                {
                    "role": m.role,
                    "content": [{"type": "image_url", "image_url": {"url": data_url(Path(p.path))}} for p in m.images]
                    + [{"type": "text", "text": m.text}],
                }
            )
        else:
            out.append({"role": m.role, "content": m.text})
    return out


def three_turns(engine, pictures, cid: str) -> list[TurnDone]:
    a, b = pictures
    asks = [("What is in this picture?", [a]), ("And this one?", [b]), ("Which of them is brighter?", [])]
    history: list[Message] = []
    done = []
    for text, pics in asks:
        history.append(Message("user", text, picture_refs(*pics)))
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
    asked = [
        ("What is in this picture?", [pictures[0]]),
        ("And this one?", [pictures[1]]),
        ("Which of them is brighter?", []),
    ]
    for r, (text, pics) in zip(turns, asked, strict=True):
        history.append(Message("user", text, picture_refs(*pics)))
        direct = client.chat.completions.create(
            model=ready.name, messages=as_openai(history), max_tokens=N, temperature=0
        )
        assert r.reply == direct.choices[0].message.content
        history.append(Message("assistant", r.reply))
    assert [t.reply for t in turns] == [t.reply for t in again]  # streaming == non-streaming
    for i, t in enumerate(turns):
        s = t.stats
        assert s.engine == "remote" and s.generated_tokens == N and s.prompt_tokens > 0
        assert t.pictures == {}  # the server keeps its picture cache to itself: no marks, none made up
        assert s.ttft_s > 0 and s.decode_s >= 0 and s.usage_reported
        if i:  # the server reused the conversation's prefix and re-sent pictures never woke its encoder
            assert s.cached_tokens > 0
            assert s.server_gate["encoder_loads"] == 0 and s.server_gate["image_cache_hits"] >= 1
    assert turns[0].stats.server_gate["pictures_encoded"] == 1


@pytest.mark.slow
def test_400_too_many_pictures_from_parley_serve(parley, pictures):
    engine = remote(parley.url)
    try:
        r = fail_turn(engine, [Message("user", "Compare them all.", picture_refs(pictures[0]) * 17)])
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
        r = run_blocking(
            engine,
            Turn("stop", [Message("user", "Tell me a long story.")], Sampling(max_new_tokens=400)),
            on_token=on_token,
            timeout=300,
        )
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
        model=name,
        messages=as_openai([Message("user", "Describe it.", picture_refs(pictures[0]))]),
        max_tokens=N,
        temperature=0,
    )
    ask = subprocess.run(
        [
            sys.executable,
            str(ROOT / "main.py"),
            "ask",
            "--remote",
            url_without_v1,
            "--model",
            name,
            "--image",
            str(pictures[0]),
            "--max-new-tokens",
            str(N),
            "Describe it.",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ask.returncode == 0, ask.stderr
    assert ask.stdout == direct.choices[0].message.content + "\n"
    script = tmp_path / "s.json"
    script.write_text(
        json.dumps(
            {
                "settings": {"max_new_tokens": N},
                "turns": [{"user": "Describe it.", "images": [str(pictures[0])]}, {"user": "Again, shorter."}],
            }
        )
    )
    rep = subprocess.run(
        [sys.executable, str(ROOT / "main.py"), "replay", "--remote", parley.url + "/", "--model", name, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rep.returncode == 0, rep.stderr
    lines = [json.loads(x) for x in rep.stdout.splitlines()]
    assert lines[0]["reply"] == direct.choices[0].message.content
    for line in lines:
        assert {"prompt_tokens", "generated_tokens", "cached_tokens", "ttft_s", "decode_s"} <= set(line["stats"])
    assert lines[1]["stats"]["cached_tokens"] > 0


def test_headless_ask_with_nothing_listening_says_so():
    port = free_port()
    r = subprocess.run(
        [sys.executable, str(ROOT / "main.py"), "ask", "--remote", f"127.0.0.1:{port}", "--model", "m", "hi"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        f"error: Cannot reach the server at http://127.0.0.1:{port}: "
        "connection refused (is the server running on that port?)."
    ]


# ---------------------------------------------------------------- transformers serve


@pytest.mark.slow
def test_transformers_serve_same_text_as_a_bare_client(tiny_model, tmp_path):
    pytest.importorskip("fastapi", reason="transformers serve needs transformers[serving] (requirements-dev.txt)")
    from tests.helpers.remote_servers import TransformersServe

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

            turn = Turn("x", [Message("user", "Go on and on.")], Sampling(max_new_tokens=300))
            stopped = run_blocking(streamed, turn, on_token=on_token, timeout=300)
            assert isinstance(stopped, TurnDone) and stopped.stopped and got.is_set()
        finally:
            streamed.shutdown()
            whole.shutdown()
        client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=300)
        history: list[Message] = []
        for r, (text, p) in zip(
            turns,
            [("What is in this picture?", [pics[0]]), ("And this one?", [pics[1]]), ("Which of them is brighter?", [])],
            strict=True,
        ):
            history.append(Message("user", text, picture_refs(*p)))
            direct = client.chat.completions.create(
                model=server.model, messages=as_openai(history), max_tokens=N, temperature=0
            )
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
    from tests.helpers.engine_helpers import open_engine

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
        r = run_blocking(
            engine,
            Turn("c", [Message("user", "Tell me everything.")], Sampling(max_new_tokens=400)),
            on_token=lambda ev: engine.stop(ev.turn_id),
            timeout=300,
        )
        assert isinstance(r, TurnDone) and r.stopped
        assert ended.wait(60)
        assert server_turns[0].stopped and len(server_turns[0].token_ids) < 400
    finally:
        engine.shutdown()
        api.stop()
        server_engine.shutdown()


def test_picture_data_urls_are_the_original_bytes_and_follow_the_file(tmp_path):
    from engine.pictures.file import PictureError
    from engine.remote.messages import DataUrlCache, chat_messages

    pic = make_picture(tmp_path / "p", 1, fmt="JPEG")  # no extension, as in Parley's history
    turn = Turn("c", [Message("user", "look", picture_refs(pic))], system_prompt="Be brief.")
    msgs = chat_messages(turn)
    assert msgs[0] == {"role": "system", "content": "Be brief."}
    url = msgs[1]["content"][0]["image_url"]["url"]
    assert url.startswith("data:image/jpeg;base64,") and base64.b64decode(url.split(",", 1)[1]) == pic.read_bytes()
    assert msgs[1]["content"][1] == {"type": "text", "text": "look"}
    cache = DataUrlCache(max_bytes=1)
    old = picture_refs(pic)[0]
    first = cache.get(old)
    make_picture(pic, 2, size=(80, 60), fmt="PNG")  # the file changed: its new content is a new ref
    new = picture_refs(pic)[0]
    assert cache.get(new) != first and cache.get(new).startswith("data:image/png;base64,")
    with pytest.raises(PictureError, match="changed on disk"):  # the old ref never sends the new bytes
        cache.get(old)
    (tmp_path / "notes.txt").write_text("not a picture")
    with pytest.raises(PictureError, match="notes.txt is not a picture"):
        cache.get(picture_refs(tmp_path / "notes.txt")[0])
