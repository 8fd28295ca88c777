"""An OpenAI chat-completions request body -> the engine's messages and sampling settings.

Everything a client can get wrong is checked here, before the engine sees the request, and
answered with a 400 naming the offending field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..pictures.store import Hold, PictureStore
from ..protocol.events import Message, Sampling
from .errors import ApiError, bad
from .files import Upload, file_part, store_file_upload
from .pictures import data_url_mime, decode_data_url, store_upload

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
DEFAULT_MAX_TOKENS = 1024
MAX_MAX_TOKENS = 32768
MAX_STOPS = 16


@dataclass
class ChatRequest:
    messages: list[Message]
    sampling: Sampling
    stream: bool = False
    include_usage: bool = False
    stops: list[str] = field(default_factory=list)
    model: str | None = None
    pictures: int = 0
    hold: Hold | None = None  # its pictures, kept until its turn is over


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _number(body: dict, name: str, default: float, lo: float, hi: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if not _is_num(v) or not lo <= v <= hi:
        raise bad(f"'{name}' must be a number from {lo:g} to {hi:g}.", name, "invalid_value")
    return float(v)


def _content(msg: dict, i: int, role: str) -> tuple[str, list[Upload]]:
    """-> (text, its pictures, PDFs and videos) of one message."""
    param = f"messages[{i}].content"
    content = msg.get("content")
    if content is None:
        if role == "assistant":
            return "", []
        raise bad(f"'{param}' is missing.", param, "missing_content")
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        raise bad(f"'{param}' must be a string or a list of content parts.", param, "invalid_type")
    texts: list[str] = []
    urls: list[Upload] = []
    for j, part in enumerate(content):
        p = f"{param}[{j}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise bad(f"'{p}' must be an object with a 'type'.", p, "invalid_type")
        kind = part["type"]
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise bad(f"'{p}.text' must be a string.", f"{p}.text", "invalid_type")
            texts.append(part["text"])
        elif kind == "image_url":
            iu = part.get("image_url")
            url = iu.get("url") if isinstance(iu, dict) else iu
            if not isinstance(url, str):
                raise bad(f"'{p}.image_url.url' must be a string.", f"{p}.image_url", "invalid_type")
            if role != "user":
                raise bad(
                    f"Pictures can only be sent in user messages ({p} is in a {role} message).", p, "invalid_value"
                )
            urls.append(Upload(url, f"{p}.image_url.url", "image"))
        elif kind in ("file", "video_url"):  # a PDF's pages, a video's frames
            if role != "user":
                raise bad(f"Files can only be sent in user messages ({p} is in a {role} message).", p, "invalid_value")
            urls.append(file_part(part, p))
        else:
            raise bad(
                f"Content part type {kind!r} is not supported (use 'text', 'image_url', 'file' (a PDF) "
                "or 'video_url').",
                f"{p}.type",
                "unsupported_content",
            )
    return "\n".join(texts), urls


def parse_chat_request(
    raw: bytes,
    pictures: PictureStore,
    max_pictures: int = 16,
    *,
    served_model: str | None = None,
    max_text_chars: int | None = None,
    hold: Hold | None = None,
) -> ChatRequest:
    """`served_model`: the loaded model's name (another name is a 404, as OpenAI answers);
    `max_text_chars`: more text than this cannot fit the context (refused before any tokenizing);
    `hold`: the request's pictures are held in the store under it (the caller releases it)."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad(f"The request body is not valid JSON ({exc}).", None, "invalid_json") from None
    except RecursionError:  # e.g. [[[[...]]]] nested 100,000 deep
        raise bad("The request body is nested too deeply to be a chat request.", None, "invalid_json") from None
    if not isinstance(body, dict):
        raise bad("The request body must be a JSON object.", None, "invalid_type")

    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("'model' must be a string.", "model", "invalid_type")
    n = body.get("n")
    if n is not None and n != 1:
        raise bad("Only n=1 is supported.", "n", "unsupported_value")
    if body.get("tools") or body.get("functions"):
        raise bad("Tool calling is not supported by Parley.", "tools", "unsupported_value")
    if body.get("logprobs"):
        raise bad("logprobs are not supported by Parley.", "logprobs", "unsupported_value")
    rf = body.get("response_format")
    if rf is not None and not (isinstance(rf, dict) and rf.get("type") == "text"):
        raise bad("Only response_format {'type': 'text'} is supported.", "response_format", "unsupported_value")

    msgs = body.get("messages")
    if msgs is None:
        raise bad("'messages' is required.", "messages", "missing_messages")
    if not isinstance(msgs, list):
        raise bad("'messages' must be a list.", "messages", "invalid_type")
    if not msgs:
        raise bad("'messages' must not be empty.", "messages", "empty_messages")
    parsed: list[tuple[str, str, list]] = []
    n_pictures = 0
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad(f"'messages[{i}]' must be an object.", f"messages[{i}]", "invalid_type")
        role = m.get("role")
        if not isinstance(role, str):
            raise bad(f"'messages[{i}].role' must be a string.", f"messages[{i}].role", "invalid_type")
        if role in ("tool", "function"):
            raise bad(
                f"Role {role!r} is not supported (Parley has no tool calling).",
                f"messages[{i}].role",
                "unsupported_role",
            )
        if role not in ROLES:
            raise bad(
                f"Unknown role {role!r} in messages[{i}] (use system, user or assistant).",
                f"messages[{i}].role",
                "invalid_role",
            )
        text, urls = _content(m, i, ROLES[role])
        n_pictures += len(urls)
        if n_pictures > max_pictures:
            raise bad(f"Too many pictures: at most {max_pictures} per request.", "messages", "too_many_pictures")
        parsed.append((ROLES[role], text, urls))
    if parsed[-1][0] != "user":
        raise bad("The last message must be a user message.", f"messages[{len(parsed) - 1}].role", "invalid_value")

    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad("'stream' must be true or false.", "stream", "invalid_type")
    so = body.get("stream_options")
    include_usage = False
    if so is not None:
        if not isinstance(so, dict):
            raise bad("'stream_options' must be an object.", "stream_options", "invalid_type")
        include_usage = bool(so.get("include_usage", False))

    max_tokens = DEFAULT_MAX_TOKENS
    for name in ("max_tokens", "max_completion_tokens"):  # the newer name wins when both are sent
        v = body.get(name)
        if v is None:
            continue
        if not _is_int(v) or not 1 <= v <= MAX_MAX_TOKENS:
            raise bad(f"'{name}' must be an integer from 1 to {MAX_MAX_TOKENS}.", name, "invalid_value")
        max_tokens = v
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise bad("'seed' must be an integer.", "seed", "invalid_type")
    stop = body.get("stop")
    if stop is None:
        stops = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        if len(stop) > MAX_STOPS:
            raise bad(f"At most {MAX_STOPS} stop sequences.", "stop", "invalid_value")
        stops = list(stop)
    else:
        raise bad("'stop' must be a string or a list of strings.", "stop", "invalid_type")
    stops = [s for s in stops if s]

    if served_model is not None and model is not None and model != served_model:
        raise ApiError(
            404,
            f"The model {model!r} does not exist here; this server runs {served_model!r}.",
            "model",
            "model_not_found",
        )
    n_chars = sum(len(text) for _, text, _ in parsed)
    if max_text_chars is not None and n_chars > max_text_chars:
        raise bad(
            f"The messages hold {n_chars} characters of text, more than can fit the model's context "
            f"(at most {max_text_chars}).",
            "messages",
            "context_length_exceeded",
        )

    # only now, with the request well formed, pay for decoding and storing pictures
    messages = []
    total = 0  # pictures so far, a PDF's pages and a video's frames included
    for role, text, urls in parsed:
        refs = []
        for up in urls:
            p = up.param
            if up.kind == "image":
                refs.append(store_upload(pictures, decode_data_url(up.url, p), p, hold))
                continue
            data = decode_data_url(up.url, p, "application/pdf" if up.kind == "file" else "video/")
            refs.extend(store_file_upload(pictures, data, data_url_mime(up.url), up, hold))
            if total + len(refs) > max_pictures:  # a PDF's pages count as pictures
                raise bad(
                    f"Too many pictures: this request's files hold more than {max_pictures} pages or frames.",
                    p,
                    "too_many_pictures",
                )
        total += len(refs)
        messages.append(Message(role, text, refs))
    greedy = temperature == 0 or top_p == 0
    sampling = Sampling(
        greedy=greedy,
        temperature=temperature if not greedy else 1.0,
        top_p=top_p if not greedy else 1.0,
        max_new_tokens=max_tokens,
        seed=seed if seed is None else int(seed) & 0xFFFF_FFFF_FFFF_FFFF,
    )
    return ChatRequest(messages, sampling, stream, include_usage, stops, model, n_pictures, hold)
