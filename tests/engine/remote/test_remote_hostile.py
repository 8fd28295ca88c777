"""The remote engine against hostile OpenAI-compatible servers on loopback: a stream that never
ends is cut at max_tokens (plus a margin) or a total deadline with its text kept; usage of the
wrong types keeps the reply; Stop and Ctrl+C end a turn the server never answers within a
second, the partial reply kept (in `replay` too); escape codes never reach the terminal."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from engine.protocol.client import run_blocking
from engine.protocol.events import Message, Sampling, Turn, TurnDone, TurnFailed, TurnStarted
from engine.remote.request import MARGIN_PIECES
from tests.helpers.remote_servers import (  # noqa: F401 (stub: the fixture)
    ROOT,
    BadChunkAfterText,
    BadUsage,
    Drips,
    EndlessEmpty,
    EndlessStream,
    EscapeCodes,
    NeverAnswers,
    remote,
    stub,
)

openai = pytest.importorskip("openai")


def turn(max_tokens=8) -> Turn:
    return Turn("c", [Message("user", "hi")], Sampling(max_new_tokens=max_tokens))


def test_an_endless_stream_is_cut_after_max_tokens_and_keeps_its_text(stub):
    server = stub(EndlessStream)
    engine = remote(server.root, model="big-vlm")
    seen: list[str] = []
    try:
        r = run_blocking(engine, turn(8), on_token=lambda ev: seen.append(ev.text), timeout=60)
        assert isinstance(r, TurnFailed), r
        assert 8 <= len(seen) <= 8 + MARGIN_PIECES and r.partial == "".join(seen)
        assert "past max_tokens" in r.message and "partial reply is kept" in r.message
    finally:
        engine.shutdown()


@pytest.mark.parametrize("handler", [EndlessEmpty, Drips])
def test_a_stream_with_no_end_meets_the_total_deadline_with_its_text_kept(stub, handler):
    server = stub(handler)
    engine = remote(server.root, model="big-vlm", total_timeout_s=2.0)
    try:
        t0 = time.monotonic()
        r = run_blocking(engine, turn(1000), timeout=60)
        took = time.monotonic() - t0
        assert isinstance(r, TurnFailed) and r.partial == "Hello", r
        assert "within 2 s" in r.message and "partial reply is kept" in r.message
        assert 2.0 <= took < 4.0
    finally:
        engine.shutdown()


@pytest.mark.parametrize("handler", [NeverAnswers, Drips])
def test_stop_ends_a_turn_the_server_never_finishes_within_a_second(stub, handler):
    server = stub(handler)
    engine = remote(server.root, model="big-vlm")
    started = threading.Event()
    engine.add_listener(lambda ev: isinstance(ev, TurnStarted) and started.set())
    box = {}
    try:
        worker = threading.Thread(target=lambda: box.setdefault("r", run_blocking(engine, turn(100), timeout=60)))
        worker.start()
        assert started.wait(30) and server.httpd.asked.wait(30)
        t0 = time.monotonic()
        engine.stop()
        worker.join(5)
        assert time.monotonic() - t0 < 1.0
        r = box["r"]
        assert isinstance(r, TurnDone) and r.stopped and r.reply == ("Hello" if handler is Drips else "")
    finally:
        engine.shutdown()


def test_usage_of_the_wrong_types_keeps_the_reply(stub, caplog):
    engine = remote(stub(BadUsage).root, model="big-vlm")
    try:
        with caplog.at_level(logging.WARNING):
            r = run_blocking(engine, turn(8), timeout=60)
        assert isinstance(r, TurnDone) and r.reply == "Hello there", r
        assert not r.stats.usage_reported and r.stats.generated_tokens == 2  # counted from the pieces
        assert r.stats.prompt_tokens == 0 and not r.stats.cached_reported
        assert not [rec for rec in caplog.records if rec.exc_info]  # no traceback
    finally:
        engine.shutdown()


def test_a_bad_chunk_after_text_is_a_mid_reply_failure_with_the_text_kept(stub):
    engine = remote(stub(BadChunkAfterText).root, model="big-vlm")
    try:
        r = run_blocking(engine, turn(8), timeout=60)
        assert isinstance(r, TurnFailed) and r.partial == "Hello", r
        assert "mid-reply" in r.message and "partial reply is kept" in r.message
        assert "holds no chat-completion chunks" not in r.message
    finally:
        engine.shutdown()


# ---------------------------------------------------------------- the terminal


def run_main(*args, **kw):
    return subprocess.run(
        [sys.executable, str(ROOT / "main.py"), *args],
        capture_output=True,
        timeout=120,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        **kw,
    )


def test_escape_codes_in_a_reply_or_an_error_never_reach_the_terminal(stub, tmp_path):
    server = stub(EscapeCodes)
    res = run_main("ask", "--remote", server.root, "--model", "big-vlm", "--data-dir", str(tmp_path / "d"), "hi")
    assert res.returncode == 0, res.stderr
    out = res.stdout.decode()
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out
    assert out.startswith("Hello\\x1b]0;pwned\\x07") and out.endswith(" there\n\tok\n")  # shown, harmless
    res = run_main(
        "ask",
        "--remote",
        server.root,
        "--model",
        "big-vlm",
        "--api-key",
        "bad",
        "--data-dir",
        str(tmp_path / "d"),
        "hi",
    )
    err = res.stderr.decode()
    assert res.returncode == 1 and "Invalid key" in err and "\x1b" not in err and "\x07" not in err
    assert err.count("\n") == 1


def _ctrl_c_as_in_a_terminal() -> None:
    """In the child: Ctrl+C acts as it does in a terminal. A suite started as a background job of
    a non-interactive shell (`cmd &` in a script) runs with SIGINT ignored, which children
    inherit; Python then installs no KeyboardInterrupt handler and the interrupt never arrives."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt_after(proc: subprocess.Popen, ready: threading.Event, printed: str = "") -> float:
    """SIGINT once `ready` is set and `printed` has come out; -> seconds from the signal until
    the process exited."""
    assert ready.wait(60), proc.stderr.read()
    assert proc.stdout.read(len(printed)) == printed
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(30)
    return time.monotonic() - t0


@pytest.mark.parametrize("handler", [NeverAnswers, Drips])
def test_ctrl_c_in_ask_exits_within_a_second_with_one_line(stub, tmp_path, handler):
    server = stub(handler)
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "main.py"),
            "ask",
            "--remote",
            server.root,
            "--model",
            "big-vlm",
            "--data-dir",
            str(tmp_path / "d"),
            "hi",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ctrl_c_as_in_a_terminal,
    )
    printed = "Hello" if handler is Drips else ""
    took = _interrupt_after(proc, server.httpd.asked, printed)
    out, err = proc.communicate()
    assert took < 1.0 and proc.returncode == 130
    assert err.count("\n") == 1 and "interrupted" in err, err
    assert printed + out == printed + ("\n" if printed else "")  # the partial reply stays on screen


def test_ctrl_c_in_replay_keeps_the_partial_reply(stub, tmp_path):
    server = stub(Drips)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"user": "hi"}, {"user": "and then?"}]}))
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "main.py"),
            "replay",
            "--remote",
            server.root,
            "--model",
            "big-vlm",
            "--data-dir",
            str(tmp_path / "d"),
            str(script),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ctrl_c_as_in_a_terminal,
    )
    took = _interrupt_after(proc, server.httpd.asked)
    out, err = proc.communicate()
    assert took < 1.0 and proc.returncode == 130
    assert err.count("\n") == 1 and "interrupted" in err, err
    [line] = [json.loads(x) for x in out.splitlines()]
    assert line["turn"] == 0 and line["partial"] == "Hello" and "interrupted" in line["error"]


def test_a_password_in_a_server_url_is_never_shown(tmp_path):
    from tests.helpers.remote_servers import free_port

    url = f"http://alice:s3cret-pw@127.0.0.1:{free_port()}"
    engine = remote(url, model="big-vlm")
    try:
        r = run_blocking(engine, turn(4), timeout=60)
        assert isinstance(r, TurnFailed) and "connection refused" in r.message
        assert "s3cret-pw" not in r.message and "alice" not in r.message and "127.0.0.1" in r.message
        assert "s3cret-pw" not in repr(engine.config)
    finally:
        engine.shutdown()
    res = run_main("ask", "--remote", url, "--model", "big-vlm", "--data-dir", str(tmp_path / "d"), "hi")
    assert res.returncode == 1 and b"s3cret-pw" not in res.stderr and b"s3cret-pw" not in res.stdout
