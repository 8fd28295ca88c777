"""A Turn as the OpenAI chat-completions API wants it: the whole conversation each request (as
every OpenAI client sends it), pictures inline as data: URLs of their original file bytes (no
decode or re-encode, so a server that keys its picture cache by content finds a re-sent one); a
PDF's page or a video's frame as a PNG of it (rendered once, then kept with the others)."""

from __future__ import annotations

import base64
import io
import threading
from collections import OrderedDict
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from ..pictures.file import PICTURE_NAMES, PICTURE_TYPES, PictureError
from ..pictures.ref import PictureRef
from ..protocol.events import Sampling, Turn

_MIME = {fmt: t.mime for t in PICTURE_TYPES for fmt in t.pillow}


def picture_mime(data: bytes, name: str) -> str:
    """The picture's type from its header (files in Parley's history have no extension)."""
    try:
        with Image.open(io.BytesIO(data)) as probe:  # reads the header only
            fmt = probe.format or ""
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
        raise PictureError(f"{name} is not a picture ({PICTURE_NAMES})") from None
    if fmt not in _MIME:
        raise PictureError(f"{name} is a {fmt} picture; servers take {PICTURE_NAMES}")
    return _MIME[fmt]


class DataUrlCache:
    """Recent pictures' data URLs, least recently used dropped past `max_bytes`: a conversation
    re-sends every picture each turn, so each file is read and encoded once, not once a turn.
    Keyed by the picture's content digest; a file read is checked against it."""

    def __init__(self, max_bytes: int = 128 << 20):
        self.max_bytes = max_bytes
        self._urls: OrderedDict[str, str] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, ref: PictureRef) -> str:
        with self._lock:
            url = self._urls.get(ref.digest)
            if url is not None:
                self._urls.move_to_end(ref.digest)
                return url
        data = ref.read_checked()
        url = f"data:{picture_mime(data, Path(ref.path).name)};base64,{base64.b64encode(data).decode('ascii')}"
        with self._lock:
            if ref.digest not in self._urls:
                self._urls[ref.digest] = url
                self._bytes += len(url)
            while self._bytes > self.max_bytes and len(self._urls) > 1:
                _, old = self._urls.popitem(last=False)
                self._bytes -= len(old)
        return url


_data_urls = DataUrlCache()


def picture_data_url(ref: PictureRef) -> str:
    return _data_urls.get(ref)


def chat_messages(turn: Turn) -> list[dict]:
    out: list[dict] = []
    if turn.system_prompt:
        out.append({"role": "system", "content": turn.system_prompt})
    for m in turn.messages:
        if not m.images:
            out.append({"role": m.role, "content": m.text})
            continue
        parts: list[dict] = []
        for p in m.images:  # a page or frame (sent as a PNG of it) after its caption, as the built-in engine has it
            if p.prompt_caption:
                parts.append({"type": "text", "text": p.prompt_caption})
            parts.append({"type": "image_url", "image_url": {"url": picture_data_url(p)}})
        if m.text:
            parts.append({"type": "text", "text": m.text})
        out.append({"role": m.role, "content": parts})
    return out


def sampling_params(s: Sampling) -> dict:
    params: dict = {"max_tokens": s.max_new_tokens}
    if s.greedy:
        params["temperature"] = 0.0
    else:
        params["temperature"] = s.temperature
        params["top_p"] = s.top_p
    if s.seed is not None:
        params["seed"] = s.seed
    return params
