"""One turn's chat-completions request: streamed reply text out as Token events, stop between
chunks (closing the stream ends the request on the server), usage into the turn's stats."""
from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Callable

import openai

from ..protocol.events import Token, Turn
from ..protocol.turn_stats import RemoteTurnStats
from .config import RemoteConfig
from .failures import describe
from .messages import sampling_params


@dataclass
class Outcome:
    reply: str = ""
    stats: RemoteTurnStats | None = None  # None when the turn failed
    stopped: bool = False
    error: str = ""  # one sentence when the turn failed; `reply` then holds any partial text


def _not_an_api(cfg: RemoteConfig, what: str) -> str:
    return f"The server at {cfg.server} is not an OpenAI-compatible API ({what})."


class TurnRequest:
    def __init__(self, client: openai.OpenAI, cfg: RemoteConfig, model: str, turn: Turn,
                 emit: Callable, should_stop: Callable[[], bool], queued_at: float | None = None):
        self.client, self.cfg, self.model, self.turn = client, cfg, model, turn
        self.queued_at = queued_at  # perf_counter when submit() queued the turn
        self.emit, self.should_stop = emit, should_stop
        self.parts: list[str] = []
        self.usage = None
        self.finish: str | None = None
        self.t0 = self.t_first = self.t_end = 0.0
        self.pieces = 0  # text pieces received (token count when the server reports no usage)
        self._open_stream = None  # the open stream, for abort() from another thread

    def run(self, messages: list[dict]) -> Outcome:
        params = dict(model=self.model, messages=messages, **sampling_params(self.turn.sampling))
        self.t0 = time.perf_counter()
        try:
            if self.cfg.stream:
                error, stopped = self._stream(params)
            else:
                error, stopped = self._whole(params), False
        except openai.APIError as exc:  # before any reply text: the request itself failed
            error, stopped = describe(exc, self.cfg, model=self.model), False
        self.t_end = time.perf_counter()
        reply = "".join(self.parts)
        if error:
            return Outcome(reply, None, False, error)
        return Outcome(reply, self._stats(), stopped)

    def _text(self, text: str) -> None:
        if self.t_first == 0.0:
            self.t_first = time.perf_counter()
        self.parts.append(text)
        self.pieces += 1
        self.emit(Token(self.turn.turn_id, self.turn.conversation_id, text, -1))

    def _stream(self, params: dict) -> tuple[str, bool]:
        stream = self.client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **params)
        self._open_stream = stream
        chunks = 0
        try:
            if self.should_stop():  # stopped while the request was being sent: abort() found no stream
                stream.close()
                return "", True
            with stream:  # leaving closes the response: the server sees its client go
                for chunk in stream:
                    chunks += 1
                    if getattr(chunk, "usage", None) is not None:
                        self.usage = chunk.usage
                    for choice in chunk.choices or []:
                        text = choice.delta.content if choice.delta is not None else None
                        if text:
                            self._text(text)
                        if choice.finish_reason:
                            self.finish = choice.finish_reason
                    if self.should_stop():
                        return "", True
        except Exception as exc:
            if self.should_stop():
                return "", True
            if isinstance(exc, (AttributeError, TypeError, ValueError)):  # chunks of another shape
                return _not_an_api(self.cfg, "its stream holds no chat-completion chunks"), False
            return describe(exc, self.cfg, "stream" if self.parts else "request", self.model), False
        if self.should_stop():
            return "", True
        if chunks == 0:
            return _not_an_api(self.cfg, "its reply holds no chat-completion events"), False
        if self.finish is None:  # the body ended without saying the reply was over
            if self.parts:
                return f"The connection to {self.cfg.server} closed mid-reply; the partial reply is kept.", False
            return f"The server at {self.cfg.server} ended its reply without any text or finish reason.", False
        return "", False

    def abort(self) -> None:
        """Stop now, from another thread: shut the stream's socket down, so the read waiting for
        the server's next chunk (seconds away on a slow server) returns at once and the reading
        thread unwinds as after a drop. Shutting the socket down wakes a blocked read; closing the
        response from this thread would not, and would race the reader inside the HTTP parser."""
        stream = self._open_stream
        network = getattr(getattr(stream, "response", None), "extensions", {}).get("network_stream")
        sock = network.get_extra_info("socket") if network is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed: the turn is ending anyway
                pass

    def _whole(self, params: dict) -> str:
        resp = self.client.chat.completions.create(stream=False, **params)
        choices = getattr(resp, "choices", None)
        if not choices or getattr(choices[0], "message", None) is None:
            return _not_an_api(self.cfg, "its reply is not a chat completion")
        self.usage = getattr(resp, "usage", None)
        self.finish = choices[0].finish_reason
        text = choices[0].message.content or ""
        if text:
            self._text(text)
        return ""

    def _stats(self) -> RemoteTurnStats:
        u = self.usage
        first = self.t_first or self.t_end
        generated = int(u.completion_tokens) if u is not None and u.completion_tokens is not None else self.pieces
        details = getattr(u, "prompt_tokens_details", None) if u is not None else None
        cached = getattr(details, "cached_tokens", None) if details is not None else None
        decode_s = max(0.0, self.t_end - first)
        extra = (getattr(u, "model_extra", None) or {}).get("parley") if u is not None else None
        if not isinstance(extra, dict):  # only another Parley says what its picture gate did
            extra = {}
        return RemoteTurnStats(
            server=self.cfg.server,
            model=self.model,
            prompt_tokens=int(u.prompt_tokens) if u is not None and u.prompt_tokens is not None else 0,
            generated_tokens=generated,
            cached_tokens=int(cached) if cached is not None else 0,
            usage_reported=u is not None,
            cached_reported=cached is not None,
            ttft_s=round(first - self.t0, 6),
            first_token_s=round(first - self.t0, 6),
            decode_s=round(decode_s, 6),
            total_s=round(self.t_end - self.t0, 6),
            tokens_per_s=round((generated - 1) / decode_s, 3) if decode_s > 0 and generated > 1 else 0.0,
            finish_reason=self.finish or "",
            streamed=self.cfg.stream,
            queue_s=round(self.t0 - self.queued_at, 6) if self.queued_at is not None else 0.0,
            server_gate={k: v for k, v in extra.items() if isinstance(v, (int, float))},
        )
