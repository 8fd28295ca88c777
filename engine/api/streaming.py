"""A streamed chat completion: server-sent `chat.completion.chunk` events as the turn generates."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from ..protocol.events import Token, TurnDone, TurnFailed
from .completion import ChatTurn, failure_status, usage

FLUSH_S = 0.05  # streamed text goes out at most this often (tokens in between share one chunk)


async def sse_events(turn: ChatTurn):
    """The reply as event-stream bytes. A failure before the first bytes raises its ApiError (the
    client gets a plain error status); after them it is sent as an error event."""
    req, scanner = turn.req, turn.scanner
    cid, created, model = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), turn.api.model_name() or ""
    loop = asyncio.get_running_loop()

    def chunk(delta: dict, finish: str | None = None) -> bytes:
        obj = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if req.include_usage:
            obj["usage"] = None
        return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"

    started = False
    pending: list[str] = []  # text not sent yet: tokens go out at most every FLUSH_S, joined
    last_write = 0.0
    # the deadline reads last_write as it is when asked, after the writes below
    async for batch in turn.events(lambda: last_write + FLUSH_S if pending else None):  # noqa: B023
        out: list[bytes] = []
        for ev in batch:
            if isinstance(ev, Token):
                piece = turn.feed(ev)
                if piece:
                    pending.append(piece)
            elif isinstance(ev, TurnFailed):
                err = failure_status(ev.message)
                if not started:
                    raise err
                out.append(b"data: " + json.dumps(err.body()).encode() + b"\n\n")
                out.append(b"data: [DONE]\n\n")
            elif isinstance(ev, TurnDone):
                tail = scanner.flush()
                if tail:
                    pending.append(tail)
                out.append(chunk({}, turn.finish_reason(ev)))
                if req.include_usage:
                    obj: dict[str, object] = {
                        "id": cid,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": model,
                        "system_fingerprint": None,
                        "choices": [],
                        "usage": usage(ev),
                    }
                    out.append(b"data: " + json.dumps(obj).encode() + b"\n\n")
                out.append(b"data: [DONE]\n\n")
        now = loop.time()
        if pending and (turn.over or now - last_write >= FLUSH_S):
            out.insert(0, chunk({"content": "".join(pending)}))
            pending.clear()
        if not out:
            continue
        last_write = now
        if not started:
            out.insert(0, chunk({"role": "assistant", "content": ""}))
            started = True
        yield b"".join(out)
