"""What the API refuses and how: every bad request gets a clean 4xx without disturbing the engine,
web pages and rebinding hosts are refused without a token, a set token is required; and the
request parts that need no model (stop sequences, the picture store, the bind check)."""

from __future__ import annotations

import json
from pathlib import Path

import blake3
import pytest

from engine.api import ApiConfigError, ApiServer, check_bind
from engine.api.stops import StopScanner
from engine.protocol.events import TurnStarted
from tests.fixtures.pictures import make_broken_picture, make_not_a_picture, make_picture
from tests.helpers.api_served import assert_good_request_works, data_url, served, user  # noqa: F401 (fixture)

openai = pytest.importorskip("openai")


# ---------------------------------------------------------------- no model needed


@pytest.mark.parametrize(
    "stops, pieces, sent, hit",
    [
        (["END"], ["ab", "cE", "N", "Dxx"], "abc", True),
        (["END"], ["ab", "cE", "N", "x"], "abcENx", False),
        (["\n\n", "##"], ["a\n", "b#", "#c"], "a\nb", True),
        (["x"], ["x"], "", True),
        ([], ["a", "b"], "ab", False),
        (["lo w", "o"], ["hel", "lo world"], "hel", True),  # the earliest stop wins
    ],
)
def test_stop_scanner_releases_only_safe_text(stops, pieces, sent, hit):
    sc = StopScanner(stops)
    out = "".join(sc.push(p) for p in pieces)
    if not sc.hit:
        out += sc.flush()
    assert out == sent and sc.text == sent and sc.hit == hit


def test_picture_store_is_content_addressed_validated_and_capped(tmp_path):
    from engine.api import ApiError
    from engine.api.pictures import store_upload
    from engine.pictures.store import PictureStore
    from tests.fixtures.pictures import picture_bytes

    a, b = picture_bytes(1), picture_bytes(2, fmt="JPEG")
    store = PictureStore(tmp_path / "pics", max_transient_bytes=max(len(a), len(b)), keep_s=0)  # room for one
    ra = store_upload(store, a, "p")
    pa = Path(ra.path)
    assert ra.digest == blake3.blake3(a).hexdigest()
    assert pa.name == ra.digest + ".png" and pa.parent.name == ra.digest[:2] and pa.read_bytes() == a
    assert store_upload(store, a, "p") == ra  # same bytes, same file
    pb = Path(store_upload(store, b, "p").path)
    assert pb.suffix == ".jpg" and pb.exists()
    assert not pa.exists() and store.pruned == 1  # over the cap: the older picture went, the new one stays
    assert Path(store_upload(store, a, "p").path).exists()  # and comes back when sent again
    with pytest.raises(ApiError) as err:
        store_upload(store, b"%PDF-1.4 not a picture", "messages[0].content[1]")
    assert err.value.status == 400 and err.value.param == "messages[0].content[1]"
    kept = PictureStore(tmp_path / "kept", max_transient_bytes=max(len(a), len(b)))
    turn = kept.hold()  # a turn in progress will read a: it is never pruned, b has to wait
    p1 = store_upload(kept, a, "p", turn)
    with pytest.raises(ApiError) as full:
        store_upload(kept, b, "p")
    assert full.value.status == 507 and Path(p1.path).exists()
    turn.release()
    assert Path(store_upload(kept, b, "p").path).exists() and not Path(p1.path).exists()
    assert not list((tmp_path / "pics").rglob("*.tmp"))


def test_the_api_cap_never_removes_a_picture_the_history_keeps(tmp_path):
    from engine.api.pictures import store_upload
    from engine.pictures.store import PictureStore
    from tests.fixtures.pictures import picture_bytes

    window = PictureStore(tmp_path / "pictures")  # as in the app: the history's store and the API's,
    a, b, c = picture_bytes(1), picture_bytes(2), picture_bytes(3)
    api = PictureStore(tmp_path / "pictures", max_transient_bytes=len(b) + len(c) - 1, keep_s=0)  # one folder
    imported = window.put(a, ".png")
    assert Path(store_upload(api, a, "p").path) == window.path(imported)  # the API's copy is the same file
    sent = store_upload(api, c, "p")  # transient
    assert window.put(c, ".png") == Path(sent.path).name  # then imported in the window: kept from now on
    store_upload(api, b, "p")  # over the cap
    assert window.path(imported).exists() and Path(sent.path).exists()
    assert api.pruned == 0 and not api.is_transient(imported) and not api.is_transient(Path(sent.path).name)
    assert len(list(api.names())) == 3  # one file per content


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


# ---------------------------------------------------------------- bad requests


def _big_picture_count(pic: Path, n: int, model: str) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(pic)}}] * n}],
    }


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
        (
            "unknown part",
            chat(messages=[{"role": "user", "content": [{"type": "input_audio"}]}]),
            400,
            "unsupported_content",
        ),
        ("ends with assistant", chat(messages=ok_msgs + [{"role": "assistant", "content": "x"}]), 400, "invalid_value"),
        ("bad base64", img("data:image/png;base64,@@not base64@@"), 400, "invalid_base64"),
        ("not a picture", img(data_url(pdf)), 400, "invalid_image"),
        ("damaged picture", img(data_url(broken)), 400, "invalid_image"),
        ("pdf data url", img(data_url(pdf, "application/pdf")), 400, "invalid_image"),
        ("remote image", img("https://example.com/cat.png"), 400, "remote_image_refused"),
        ("file url", img("file:///etc/passwd"), 400, "invalid_image_url"),
        (
            "too many pictures",
            ("POST", "/v1/chat/completions", json.dumps(_big_picture_count(good, 17, model))),
            400,
            "too_many_pictures",
        ),
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
    status, _, data = served.raw(
        "POST",
        "/v1/chat/completions",
        json.dumps({"messages": [user("hi")]}),
        headers={"Origin": "https://evil.example"},
    )
    assert status == 403 and json.loads(data)["error"]["code"] == "origin_not_allowed"
    status, _, _ = served.raw(
        "GET", "/v1/models", headers={"Host": "localhost:8011", "Origin": "http://127.0.0.1:3000"}
    )
    assert status == 200


@pytest.mark.slow
def test_token_is_required_when_set(served):
    with pytest.raises(ApiConfigError, match="Refusing"):
        ApiServer(served.engine, "0.0.0.0", 0)
    secured = ApiServer(served.engine, "127.0.0.1", 0, token="s3cret-token").start()
    try:
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": "s3cret-token"},
            {"Authorization": "Basic s3cret-token"},
        ):
            status, hdrs, data = served.raw("GET", "/v1/models", headers=headers, server=secured)
            assert status == 401, headers
            assert json.loads(data)["error"]["code"] == "invalid_api_key"
            assert hdrs.get("WWW-Authenticate", "").startswith("Bearer")
        status, _, _ = served.raw(
            "POST", "/v1/chat/completions", json.dumps({"messages": [user("hi")]}), server=secured
        )
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


@pytest.mark.parametrize(
    ("filename", "caption"),
    [
        ("memo.pdf", "memo.pdf, page 2"),
        ("C:\\Users\\ann\\Documents\\memo.pdf", "memo.pdf, page 2"),  # only the file's own name
        ("../../srv/data/memo.pdf", "memo.pdf, page 2"),
        ("me\nmo\x00\u202e.pdf", "memo.pdf, page 2"),  # no new line, NUL or direction override in the prompt
        (None, "Page 2"),
        ("", "Page 2"),
    ],
)
def test_a_pdf_parts_filename_names_its_pages_as_a_dropped_files_name_does(tmp_path, filename, caption):
    from engine.api.errors import ApiError
    from engine.api.request import parse_chat_request
    from engine.pictures.store import PictureStore
    from tests.fixtures.documents import make_pdf

    store = PictureStore(tmp_path / "pictures")
    pdf = make_pdf(tmp_path / "x.pdf", 2, size=(60, 80))
    part: dict = {"file_data": data_url(pdf, "application/pdf")}
    if filename is not None:
        part["filename"] = filename
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "?"}, {"type": "file", "file": part}]}]}
    request = parse_chat_request(json.dumps(body).encode(), store)
    assert [r.caption for r in request.messages[0].images] == [caption.replace("2", "1"), caption]
    part["filename"] = 7
    with pytest.raises(ApiError) as err:
        parse_chat_request(json.dumps(body).encode(), store)
    assert err.value.status == 400 and err.value.body()["error"]["param"] == "messages[0].content[1].file.filename"
