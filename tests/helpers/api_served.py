"""The API tests' served engine: a tiny llava model behind a running ApiServer, the real `openai`
client on it, raw HTTP for what that client cannot send, and the reference replies."""

from __future__ import annotations

import base64
import http.client
from pathlib import Path

import pytest

from engine.api import ApiServer
from engine.protocol.events import Message
from tests.helpers.engine_helpers import Reference, open_engine

openai = pytest.importorskip("openai")


def data_url(path: Path, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(Path(path).read_bytes()).decode()


def user(text: str, *pictures: Path) -> dict:
    if not pictures:
        return {"role": "user", "content": text}
    return {
        "role": "user",
        "content": [{"type": "text", "text": text}]
        + [{"type": "image_url", "image_url": {"url": data_url(p)}} for p in pictures],
    }


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

    def raw(
        self,
        method: str,
        path: str,
        body: bytes | str | None = None,
        headers: dict | None = None,
        server: ApiServer | None = None,
    ):
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
