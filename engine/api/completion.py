"""One chat completion's engine turn: waiting for its events, cutting at stop sequences, stopping
it when the client goes away, and the plain (non-streamed) JSON reply."""
from __future__ import annotations

import queue
import time
import uuid
from typing import Callable

from ..events import Token, TurnDone, TurnFailed
from .errors import ApiError, ClientGone
from .request import ChatRequest
from .stops import StopScanner

POLL_S = 0.2  # how often a waiting request checks that its client is still there


def failure_status(message: str) -> ApiError:
    if message.startswith("No model is loaded"):
        return ApiError(503, message, None, "model_not_loaded")
    if message.startswith("The model failed"):
        return ApiError(500, message, None, "model_error")
    return ApiError(400, message, "messages", "invalid_request")


def usage(done: TurnDone) -> dict:
    s = done.stats or {}
    prompt = int(s.get("prompt_tokens", 0))
    completion = len(done.token_ids)
    cached = int(s.get("reused_tokens", 0)) + int(s.get("restored_tokens", 0))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
            # what the picture gate did, for a Parley window using this server (its memory dock)
            "parley": {k: int(s.get(k, 0)) for k in ("encoder_loads", "pictures_encoded", "image_cache_hits")}}


class ChatTurn:
    """The submitted turn `tid` of request `req`, whose events arrive in `q`."""

    def __init__(self, api, tid: int, q: queue.Queue, req: ChatRequest, client_gone: Callable[[], bool]):
        self.api = api
        self.tid = tid
        self.q = q
        self.req = req
        self.client_gone = client_gone
        self.scanner = StopScanner(req.stops)
        self.over = False  # the last batch held the turn's end

    def events(self, due: Callable[[], float | None] = lambda: None):
        """Batches of this turn's events until it is done; a vanished client stops the turn.
        `due()` may name a moment (monotonic) by which the caller wants a batch, even an empty one."""
        self.over = False
        checked = time.monotonic()
        while True:
            wake = due()
            timeout = POLL_S if wake is None else min(POLL_S, max(0.0, wake - time.monotonic()))
            try:
                batch = [self.q.get(timeout=timeout)]
                try:
                    while True:
                        batch.append(self.q.get_nowait())
                except queue.Empty:
                    pass
            except queue.Empty:
                batch = []
            self.over = any(isinstance(e, (TurnDone, TurnFailed)) for e in batch)
            if time.monotonic() - checked >= POLL_S:
                checked = time.monotonic()
                if not self.over and self.client_gone():
                    self.abandon()
            yield batch
            if self.over:
                return

    def abandon(self):
        """The client went away: stop its generation (unless it is already over)."""
        if not self.over:
            self.api.engine.stop(self.tid)
        self.api.activity.count("disconnects")
        raise ClientGone()

    def feed(self, ev: Token) -> str:
        """The part of this token's text that is safe to send; a stop sequence stops the turn."""
        hit_before = self.scanner.hit
        piece = self.scanner.push(ev.text)
        if self.scanner.hit and not hit_before:
            self.api.engine.stop(self.tid)
        return piece

    def finish_reason(self, done: TurnDone) -> str:
        if self.scanner.hit or done.stopped:
            return "stop"
        loaded = self.api.engine.loaded
        eos = loaded.eos_ids if loaded is not None else set()
        if done.token_ids and done.token_ids[-1] in eos:
            return "stop"
        # the engine may have cut the limit to fit the context: that is a "length" finish too
        limit = done.stats.get("max_new_tokens", self.req.sampling.max_new_tokens)
        return "length" if len(done.token_ids) >= limit else "stop"


def complete(turn: ChatTurn, send_json: Callable[[int, dict], None]) -> None:
    """Wait for the whole reply and send it as one `chat.completion` object."""
    scanner = turn.scanner
    for batch in turn.events():
        for ev in batch:
            if isinstance(ev, Token):
                turn.feed(ev)
            elif isinstance(ev, TurnFailed):
                raise failure_status(ev.message)
            elif isinstance(ev, TurnDone):
                if not turn.req.stops:
                    scanner.push(ev.reply)  # tokens were not sent here: the reply is the text
                scanner.flush()
                return send_json(200, {
                    "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                    "created": int(time.time()), "model": turn.api.model_name() or "",
                    "system_fingerprint": None,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": scanner.text},
                                 "logprobs": None, "finish_reason": turn.finish_reason(ev)}],
                    "usage": usage(ev),
                })
