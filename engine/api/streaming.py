"""A streamed chat completion: server-sent `chat.completion.chunk` events as the turn generates."""
from __future__ import annotations

import json
import time
import uuid

from ..events import Token, TurnDone, TurnFailed
from .completion import ChatTurn, failure_status, usage

FLUSH_S = 0.05  # streamed text goes out at most this often (tokens in between share one chunk)


def stream(turn: ChatTurn, handler) -> None:
    """Send the reply on `handler` (the request's RequestHandler) as an event stream, chunked
    unless the client speaks HTTP/1.0."""
    req, scanner = turn.req, turn.scanner
    cid, created, model = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), turn.api.model_name() or ""

    def chunk(delta: dict, finish: str | None = None) -> bytes:
        obj = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
               "system_fingerprint": None,
               "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        if req.include_usage:
            obj["usage"] = None
        return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"

    pending: list[str] = []  # text not sent yet: tokens go out at most every FLUSH_S, joined
    last_write = [0.0]
    for batch in turn.events(lambda: last_write[0] + FLUSH_S if pending else None):
        out: list[bytes] = []
        for ev in batch:
            if isinstance(ev, Token):
                piece = turn.feed(ev)
                if piece:
                    pending.append(piece)
            elif isinstance(ev, TurnFailed):
                err = failure_status(ev.message)
                if not handler.headers_sent:
                    raise err
                out.append(b"data: " + json.dumps(err.body()).encode() + b"\n\n")
                out.append(b"data: [DONE]\n\n")
            elif isinstance(ev, TurnDone):
                tail = scanner.flush()
                if tail:
                    pending.append(tail)
                out.append(chunk({}, turn.finish_reason(ev)))
                if req.include_usage:
                    obj = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                           "system_fingerprint": None, "choices": [], "usage": usage(ev)}
                    out.append(b"data: " + json.dumps(obj).encode() + b"\n\n")
                out.append(b"data: [DONE]\n\n")
        now = time.monotonic()
        if pending and (turn.over or now - last_write[0] >= FLUSH_S):
            out.insert(0, chunk({"content": "".join(pending)}))
            pending.clear()
        if not out:
            continue
        last_write[0] = now
        if not handler.headers_sent:
            out.insert(0, chunk({"role": "assistant", "content": ""}))
        body = data = b"".join(out)
        chunked = handler.request_version != "HTTP/1.0"  # an HTTP/1.0 client reads until we close
        if chunked:
            body = b"%x\r\n%s\r\n" % (len(data), data)
            if turn.over:
                body += b"0\r\n\r\n"  # the chunked body's end
        try:
            if not handler.headers_sent:
                handler.send_response(200)
                handler.send_header("Content-Type", "text/event-stream; charset=utf-8")
                handler.send_header("Cache-Control", "no-cache")
                if chunked:
                    handler.send_header("Transfer-Encoding", "chunked")
                else:
                    handler.close_connection = True
                    handler.send_header("Connection", "close")
                handler.send_header("X-Accel-Buffering", "no")
                handler.end_headers_with(body)
            else:
                handler.wfile.write(body)
        except OSError:
            turn.abandon()
