"""One turn's chat-completions request: streamed reply text out as Token events, stop between
chunks (closing the stream ends the request on the server), usage into the turn's stats.

Whatever the server does, the turn ends: the reply is read on a helper thread and handed over a
queue, so Stop (and Ctrl+C) end a turn at once even while a read is blocked on a server that
never answers or drips bytes; the whole request has a deadline (`RemoteConfig.total_s`); and no
more than max_tokens + MARGIN_PIECES pieces of text, nor more than `_byte_limit` bytes, are
read. Whatever text arrived is kept. Usage is optional: counts that are not counts are ignored.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import openai

from ..protocol.events import Token, Turn
from ..protocol.turn_stats import RemoteTurnStats
from ..protocol.worker import TurnFailure
from .config import RemoteConfig
from .failures import describe
from .messages import sampling_params

# a server may split a token's text over two chunks; this many pieces past max_tokens is no longer that
MARGIN_PIECES = 16
# an SSE chunk for one token is 150-400 bytes (vLLM, transformers serve, Parley; more with usage in
# each): a body past this per piece is not a reply any more
BYTES_PER_PIECE = 4096


@dataclass
class Outcome:
    """A turn that finished (stopped early included); one that failed raises TurnFailure instead."""

    reply: str
    stats: RemoteTurnStats
    stopped: bool = False


def _not_an_api(cfg: RemoteConfig, what: str) -> str:
    return f"The server at {cfg.server} is not an OpenAI-compatible API ({what})."


class _TooMuch(Exception):
    """The body ran past the bytes a reply of max_tokens can take."""


class _Reader:
    """Runs the request on a daemon thread and hands over what arrives: ("chunk", c) for each
    streamed chunk, ("whole", r) for a plain reply, ("end", None), or ("error", exc). `give_up()`
    lets the turn go on without it: a read blocked after the reply's head is woken by shutting
    the socket (the server sees its client leave); one blocked before any answer ends at the
    client's read timeout, then quietly."""

    def __init__(self, request: Callable, stream: bool, byte_limit: int, items: queue.Queue):
        self.request, self.stream, self.byte_limit, self.items = request, stream, byte_limit, items
        self.abandoned = threading.Event()
        self._response = None
        self._thread = threading.Thread(target=self._run, name="parley-remote-read", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _put(self, kind: str, item) -> None:
        if not self.abandoned.is_set():
            self.items.put((kind, item))

    def _run(self) -> None:
        try:
            answer = self.request()
            if not self.stream:
                self._put("whole", answer)
                return
            self._response = answer.response
            _bound(answer.response, self.byte_limit)
            with answer:  # leaving closes the response: the server sees its client go
                if self.abandoned.is_set():
                    return
                for chunk in answer:
                    self._put("chunk", chunk)
                    if self.abandoned.is_set():
                        return
            self._put("end", None)
        except BaseException as exc:  # handed over whole: the turn's thread says what it means
            self._put("error", exc)

    def give_up(self) -> None:
        self.abandoned.set()
        response = self._response
        if response is None:
            return
        stream = (getattr(response, "extensions", None) or {}).get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _bound(response, limit: int) -> None:
    """At most `limit` decoded bytes come out of `response.iter_bytes()` (the openai client
    reads the body only through it); past that the read raises _TooMuch. Decoded, not raw: a
    gzip body is bounded by what it unpacks to."""
    read = response.iter_bytes

    def bounded(*args, **kwargs):
        n = 0
        for part in read(*args, **kwargs):
            n += len(part)
            if n > limit:
                raise _TooMuch()
            yield part

    response.iter_bytes = bounded


class TurnRequest:
    def __init__(
        self,
        client: openai.OpenAI,
        cfg: RemoteConfig,
        model: str,
        turn: Turn,
        emit: Callable,
        should_stop: Callable[[], bool],
        queued_at: float | None = None,
    ):
        self.client, self.cfg, self.model, self.turn = client, cfg, model, turn
        self.queued_at = queued_at  # perf_counter when submit() queued the turn
        self.emit, self.should_stop = emit, should_stop
        self.parts: list[str] = []
        self.usage = None
        self.finish: str | None = None
        self.t0 = self.t_first = self.t_end = 0.0
        self.pieces = 0  # text pieces received (token count when the server reports no usage)
        self._items: queue.Queue = queue.Queue()

    def abort(self) -> None:
        """Stop asked (any thread): the turn ends now, whatever the read is doing; the reader
        then shuts the stream's socket down (give_up), so the server sees its client go."""
        self._items.put(("stop", None))

    def run(self, messages: list[dict]) -> Outcome:
        """The finished turn, or TurnFailure with one sentence and any partial reply."""
        params = dict(model=self.model, messages=messages, **sampling_params(self.turn.sampling))
        self.t0 = time.perf_counter()
        error, stopped = self._read(params)
        self.t_end = time.perf_counter()
        reply = "".join(self.parts)
        if error:
            raise TurnFailure(error, reply)
        return Outcome(reply, self._stats(), stopped)

    def _text(self, text: str) -> None:
        if self.t_first == 0.0:
            self.t_first = time.perf_counter()
        self.parts.append(text)
        self.pieces += 1
        self.emit(Token(self.turn.turn_id, self.turn.conversation_id, text, -1))

    def _kept(self) -> str:
        return "; the partial reply is kept" if self.parts else ""

    def _read(self, params: dict) -> tuple[str, bool]:
        """-> (error sentence or "", stopped)."""
        max_tokens = self.turn.sampling.max_new_tokens
        stream = self.cfg.stream
        if stream:
            request = lambda: self.client.chat.completions.create(  # noqa: E731
                stream=True, stream_options={"include_usage": True}, **params
            )
        else:
            request = lambda: self.client.chat.completions.create(stream=False, **params)  # noqa: E731
        reader = _Reader(request, stream, (max_tokens + MARGIN_PIECES) * BYTES_PER_PIECE + (1 << 20), self._items)
        total_s = self.cfg.total_s(max_tokens)
        deadline = self.t0 + total_s
        if self.should_stop():
            return "", True
        reader.start()
        chunks = 0
        try:
            while True:
                try:
                    kind, item = self._items.get(timeout=max(0.0, deadline - time.perf_counter()))
                except queue.Empty:
                    return (
                        f"The server at {self.cfg.server} did not finish its reply within {total_s:.0f} s"
                        f"{self._kept()}."
                    ), False
                if kind == "stop":
                    return "", True
                if kind == "error":
                    return self._failed(item), False
                if kind == "whole":
                    return self._whole(item), False
                if kind == "end":
                    break
                chunks += 1
                try:
                    self._chunk(item)
                except (AttributeError, TypeError, ValueError):  # a chunk of another shape
                    if self.parts:
                        return (
                            f"The server at {self.cfg.server} sent something that is not a chat-completion "
                            f"chunk mid-reply{self._kept()}."
                        ), False
                    return _not_an_api(self.cfg, "its stream holds no chat-completion chunks"), False
                if self.should_stop():
                    return "", True
                if self.pieces >= max_tokens + MARGIN_PIECES and self.finish is None:
                    return (
                        f"The server at {self.cfg.server} kept sending past max_tokens ({max_tokens}); "
                        f"Parley stopped reading{self._kept()}."
                    ), False
        finally:
            reader.give_up()
        if chunks == 0:
            return _not_an_api(self.cfg, "its reply holds no chat-completion events"), False
        if self.finish is None:  # the body ended without saying the reply was over
            if self.parts:
                return f"The connection to {self.cfg.server} closed mid-reply; the partial reply is kept.", False
            return f"The server at {self.cfg.server} ended its reply without any text or finish reason.", False
        return "", False

    def _failed(self, exc: BaseException) -> str:
        if isinstance(exc, _TooMuch):
            return (
                f"The server at {self.cfg.server} sent more than a reply of max_tokens can hold; Parley "
                f"stopped reading{self._kept()}."
            )
        if isinstance(exc, (AttributeError, TypeError, ValueError)):
            if self.parts:
                return f"The server at {self.cfg.server} sent an unreadable stream mid-reply{self._kept()}."
            return _not_an_api(self.cfg, "its stream holds no chat-completion chunks")
        if isinstance(exc, Exception):
            return describe(exc, self.cfg, "stream" if self.parts else "request", self.model)
        raise exc  # not an error of the request's (KeyboardInterrupt, SystemExit): not ours to swallow

    def _chunk(self, chunk) -> None:
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            self.usage = usage
        for choice in chunk.choices or []:
            text = choice.delta.content if choice.delta is not None else None
            if text:
                if not isinstance(text, str):
                    raise TypeError("content is not text")
                self._text(text)
            if choice.finish_reason:
                self.finish = str(choice.finish_reason)

    def _whole(self, resp) -> str:
        choices = getattr(resp, "choices", None)
        try:
            if not choices or getattr(choices[0], "message", None) is None:
                return _not_an_api(self.cfg, "its reply is not a chat completion")
            self.usage = getattr(resp, "usage", None)
            self.finish = choices[0].finish_reason
            text = choices[0].message.content or ""
        except (AttributeError, TypeError, ValueError, IndexError, KeyError):
            return _not_an_api(self.cfg, "its reply is not a chat completion")
        if not isinstance(text, str):
            return _not_an_api(self.cfg, "its reply's content is not text")
        if len(text) > (self.turn.sampling.max_new_tokens + MARGIN_PIECES) * BYTES_PER_PIECE:
            return (
                f"The server at {self.cfg.server} sent more than a reply of max_tokens can hold; Parley "
                f"did not keep it."
            )
        if text:
            self._text(text)
        return ""

    def _stats(self) -> RemoteTurnStats:
        u = self.usage
        prompt, completion = _count(u, "prompt_tokens"), _count(u, "completion_tokens")
        details = getattr(u, "prompt_tokens_details", None) if u is not None else None
        cached = _count(details, "cached_tokens")
        reported = prompt is not None or completion is not None  # usage whose counts are not counts is none
        first = self.t_first or self.t_end
        generated = completion if completion is not None else self.pieces
        decode_s = max(0.0, self.t_end - first)
        extra: object = (getattr(u, "model_extra", None) or {}).get("parley") if u is not None else None
        if not isinstance(extra, dict):  # only another Parley says what its picture gate did
            extra = {}
        return RemoteTurnStats(
            server=self.cfg.server,
            model=self.model,
            prompt_tokens=prompt or 0,
            generated_tokens=generated,
            cached_tokens=cached or 0,
            usage_reported=reported,
            cached_reported=cached is not None,
            ttft_s=round(first - self.t0, 6),
            first_token_s=round(first - self.t0, 6),
            decode_s=round(decode_s, 6),
            total_s=round(self.t_end - self.t0, 6),
            tokens_per_s=round((generated - 1) / decode_s, 3) if decode_s > 0 and generated > 1 else 0.0,
            finish_reason=self.finish or "",
            streamed=self.cfg.stream,
            queue_s=round(self.t0 - self.queued_at, 6) if self.queued_at is not None else 0.0,
            server_gate={
                k: v
                for k, v in extra.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and isinstance(k, str)
            },
        )


def _count(obj, name: str) -> int | None:
    """A token count the server reported, or None when it did not (or sent something else)."""
    v = getattr(obj, name, None) if obj is not None else None
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 40 else None
