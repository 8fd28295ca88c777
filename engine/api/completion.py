"""One chat completion's engine turn: waiting for its events, cutting at stop sequences, stopping
it when the client goes away, and the plain (non-streamed) JSON reply."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

from ..protocol.events import Token, TurnDone, TurnFailed
from ..protocol.turn_stats import LocalTurnStats
from .errors import ApiError
from .request import ChatRequest
from .stops import StopScanner

GONE = object()  # put in a turn's queue when its client went away or the server is stopping


def failure_status(message: str) -> ApiError:
    if message.startswith("No model is loaded"):
        return ApiError(503, message, None, "model_not_loaded")
    if message.startswith("The model failed"):
        return ApiError(500, message, None, "model_error")
    if "more than the model's context" in message:
        return ApiError(400, message, "messages", "context_length_exceeded")
    return ApiError(400, message, "messages", "invalid_request")


def usage(done: TurnDone) -> dict:
    s = done.stats
    prompt, completion = s.prompt_tokens, len(done.token_ids)
    local = s if isinstance(s, LocalTurnStats) else None  # a remote engine's turn: no numbers of ours
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": local.reused_tokens + local.restored_tokens if local else 0},
        # what the picture gate did, for a Parley window using this server (its memory dock)
        "parley": {
            "encoder_loads": local.encoder_loads if local else 0,
            "pictures_encoded": local.pictures_encoded if local else 0,
            "image_cache_hits": local.image_cache_hits if local else 0,
        },
    }


class ChatTurn:
    """The submitted turn `tid` of request `req`, whose engine events arrive in `q` (an asyncio
    queue filled from the model thread by the server)."""

    def __init__(self, api, tid: int, q: asyncio.Queue, req: ChatRequest):
        self.api = api
        self.tid = tid
        self.q = q
        self.req = req
        self.scanner = StopScanner(req.stops)
        self.over = False  # the turn's end (TurnDone / TurnFailed) has arrived
        self.gone = False  # its client went away: the turn was stopped, nothing more is sent

    async def watch_client(self, receive) -> None:
        """Runs beside the reply: the client hanging up stops the generation at once."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
        if not self.over:
            self.client_gone()

    def client_gone(self) -> None:
        if self.gone:
            return
        self.gone = True
        self.api.engine.stop(self.tid)
        self.api.activity.count("disconnects")
        self.q.put_nowait(GONE)

    async def events(self, due: Callable[[], float | None] = lambda: None):
        """Batches of this turn's events until it is done (or its client is gone). `due()` may
        name a moment (loop time) by which the caller wants a batch, even an empty one."""
        loop = asyncio.get_running_loop()
        while True:
            wake = due()
            try:
                if wake is None:
                    first = await self.q.get()
                else:
                    first = await asyncio.wait_for(self.q.get(), max(0.0, wake - loop.time()))
                batch = [first]
                while not self.q.empty():
                    batch.append(self.q.get_nowait())
            except TimeoutError:
                batch = []
            if self.gone or any(e is GONE for e in batch):
                if not self.gone and not self.over:  # the server is stopping
                    self.api.engine.stop(self.tid)
                self.gone = True
                return
            self.over = any(isinstance(e, (TurnDone, TurnFailed)) for e in batch)
            yield batch
            if self.over:
                return

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
        s = done.stats
        limit = s.max_new_tokens if isinstance(s, LocalTurnStats) else self.req.sampling.max_new_tokens
        return "length" if len(done.token_ids) >= limit else "stop"


async def complete(turn: ChatTurn) -> dict | None:
    """The whole reply as one `chat.completion` object (None when the client went away)."""
    scanner = turn.scanner
    async for batch in turn.events():
        for ev in batch:
            if isinstance(ev, Token):
                turn.feed(ev)
            elif isinstance(ev, TurnFailed):
                raise failure_status(ev.message)
            elif isinstance(ev, TurnDone):
                if not turn.req.stops:
                    scanner.push(ev.reply)  # tokens were not sent here: the reply is the text
                scanner.flush()
                return {
                    "id": f"chatcmpl-{uuid.uuid4().hex}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": turn.api.model_name() or "",
                    "system_fingerprint": None,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": scanner.text},
                            "logprobs": None,
                            "finish_reason": turn.finish_reason(ev),
                        }
                    ],
                    "usage": usage(ev),
                }
    return None
