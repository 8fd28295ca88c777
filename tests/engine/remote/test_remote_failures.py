"""Each way a server can fail, against a real socket on loopback (nothing listening, DNS, TLS,
401/403/404/413, a plain web site, a timeout, a stream dropped mid-reply, an unreadable
picture): the turn fails with one clear sentence, the conversation sent is left as it was, and
the engine keeps working."""

from __future__ import annotations

import pytest

from engine.pictures.ref import PictureRef
from engine.protocol.client import EngineError, load_blocking, run_blocking
from engine.protocol.events import Message, Turn, TurnFailed
from tests.fixtures.pictures import make_picture, pics as picture_refs
from tests.helpers.remote_servers import (  # noqa: F401 (stub: the fixture)
    DropsMidStream,
    Forbidden,
    NeverAnswers,
    PlainWebsite,
    Strict,
    Unauthorized,
    fail_turn,
    free_port,
    remote,
    stub,
)

openai = pytest.importorskip("openai")


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
    r = check(
        stub(Strict).root,
        "refused the request as too large (413)",
        messages=[Message("user", "compare", picture_refs(*pics))],
    )
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
        r = run_blocking(
            engine, Turn("c", [Message("user", "hi")]), on_token=lambda ev: seen.append(ev.text), timeout=60
        )
        assert isinstance(r, TurnFailed)
        assert r.partial == "Half a reply" == "".join(seen)
        assert "dropped mid-reply; the partial reply is kept" in r.message
    finally:
        engine.shutdown()


def test_unreadable_picture_fails_the_turn_alone(tmp_path, stub):
    s = stub(Strict)
    gone = PictureRef(str(tmp_path / "gone.png"), "0" * 64)
    r = check(s.root, "Picture not found", messages=[Message("user", "look", [gone])])
    assert r.partial == ""
