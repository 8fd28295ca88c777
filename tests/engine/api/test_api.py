"""The OpenAI-compatible API on the running engine: the real `openai` client gets the engine's
own greedy replies, re-sent conversations reuse the KV prefix and the image cache, API and
window turns share one queue, and the `serve` command serves."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import blake3
import pytest

from engine.protocol.events import Message, TurnDone
from tests.fixtures.pictures import make_picture, pics
from tests.helpers.api_served import served, user  # noqa: F401 (fixture)
from tests.helpers.engine_helpers import ask, expect_done

openai = pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[3]


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
    want, ids = served.ref_text([Message("user", "What is in this picture?", pics(pic))], 8)
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
    digest = blake3.blake3(pic.read_bytes()).hexdigest()
    stored = served.root / "data" / "pictures" / digest[:2] / (digest + ".png")
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
    want = full[: full.index(stop)]
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
    msgs = [Message("user", "Describe this picture.", pics(pic))]
    convo = [user("Describe this picture.", pic)]
    reply = served.chat(convo).choices[0].message.content
    assert engine.last_turn_stats.pictures_encoded == 1
    for text, sent in [("And the colours?", []), ("Compare it with this one again.", [pic])]:
        engine.unload_encoder()  # not resident: any need for the encoder would show as a load
        convo += [{"role": "assistant", "content": reply}, user(text, *sent)]
        msgs += [Message("assistant", reply), Message("user", text, pics(*sent))]
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
    refused = subprocess.run(
        [
            sys.executable,
            str(ROOT / "main.py"),
            "serve",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
            "--data-dir",
            str(tmp_path / "d"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert refused.returncode != 0 and "--api-token" in refused.stderr
    err_path = tmp_path / "serve.stderr"  # a file, never a pipe nobody drains (a full pipe blocks the server)
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "main.py"),
                "serve",
                "--port",
                "0",
                "--model",
                str(tiny_model("llava")),
                "--data-dir",
                str(tmp_path / "d"),
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=dict(env, PYTHONFAULTHANDLER="1"),
            # started with SIGINT ignored, as under nohup or a script's background
            # job (where this test hung): Ctrl+C must still stop it
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
    try:
        line = proc.stdout.readline()
        assert "http://127.0.0.1:" in line, (line, err_path.read_text() if proc.poll() is not None else "")
        url = line[line.index("http://") :].split()[0]
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
        model = client.models.list().data[0].id
        r = client.chat.completions.create(model=model, messages=[user("hi")], max_tokens=2, temperature=0)
        assert r.usage.completion_tokens == 2
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(30)  # it stops in 1-2 s
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)  # faulthandler writes every thread's stack: where it hangs
            proc.wait(30)
            raise AssertionError(
                "serve did not stop within 30 s of Ctrl+C; its stderr:\n" + err_path.read_text()[-8000:]
            ) from None
    assert rc == 0
