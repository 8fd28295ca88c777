"""The API as an ASGI application (Starlette requests and responses, served by uvicorn): checks
access, routes /v1/models and /v1/chat/completions, reads bodies under size and time limits,
and answers errors in OpenAI's shape."""

from __future__ import annotations

import asyncio
import logging

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from ..protocol.events import Turn
from .completion import ChatTurn, complete
from .errors import ApiError, ClientGone
from .streaming import sse_events

log = logging.getLogger(__name__)


class ErrorResponse(JSONResponse):
    """An error in OpenAI's shape. A request body the app did not read is read and dropped
    first (bounded), so the client, still sending it, gets this answer rather than a reset."""

    def __init__(self, err: ApiError, body_left: int, max_body: int, idle_s: float, total_s: float):
        headers = dict(err.headers)
        if err.status == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="parley"'
        self.body_left, self.max_body, self.drain_limit = body_left, max_body, 4 * max_body
        self.idle_s, self.total_s = idle_s, total_s
        if body_left > max_body:
            headers["Connection"] = "close"  # a body this big is not read to keep the connection
        super().__init__(err.body(), err.status, headers)

    async def __call__(self, scope, receive, send) -> None:
        if not self.body_left:
            return await super().__call__(scope, receive, send)
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body, "more_body": True})
        discard = scope.get("extensions", {}).get("parley.discard_body", {}).get("discard")
        dropping = discard(self.drain_limit) if discard is not None and self.body_left > self.max_body else None
        if dropping is not None:  # the connection closes after this answer: drop the body unparsed
            with anyio.move_on_after(self.total_s):
                await dropping
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        left = self.drain_limit  # read while the client keeps sending, as a body is read
        with anyio.move_on_after(self.total_s):
            while left > 0:
                with anyio.move_on_after(self.idle_s) as idle:
                    message = await receive()
                if idle.cancelled_caught:
                    break
                if message["type"] != "http.request":
                    break
                left -= len(message.get("body", b""))
                if not message.get("more_body"):
                    break
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class ApiApp:
    """`ApiApp(api)`: the ASGI callable for an ApiServer `api`."""

    def __init__(self, api):
        self.api = api

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return  # no lifespan events are needed (uvicorn runs with lifespan off)
        api = self.api
        request = Request(scope, receive)
        state = {"body_left": _declared_body(request)}
        try:
            with api.serving():
                response = await self._route(request, state, send)
        except ApiError as err:
            api.activity.count("errors")
            response = ErrorResponse(
                err, state["body_left"], api.max_body_bytes, api.client_timeout_s, api.body_timeout_s
            )
        except ClientGone:
            return
        except Exception as exc:
            log.exception("API request failed")
            api.activity.count("errors")
            internal = ApiError(500, f"Internal error: {type(exc).__name__}: {exc}", None, "internal_error")
            response = ErrorResponse(
                internal, state["body_left"], api.max_body_bytes, api.client_timeout_s, api.body_timeout_s
            )
        if response is not None:
            await response(scope, receive, send)

    async def _route(self, request: Request, state: dict, send):
        """-> the response to send, or None when it has been sent (a chat completion)."""
        api, method = self.api, request.method
        api.access.check(request.headers, api.address[0])
        path = request.url.path.rstrip("/") or "/"
        if path == "/v1/chat/completions":
            _allow(method, "POST")
            return await self._chat(request, state, send)
        if path == "/v1/models":
            _allow(method, "GET")
            return self._models(None)
        if path.startswith("/v1/models/"):
            _allow(method, "GET")
            return self._models(path[len("/v1/models/") :])
        raise ApiError(
            404, f"Unknown path {path!r} (Parley serves /v1/models and /v1/chat/completions).", None, "not_found"
        )

    def _models(self, wanted: str | None):
        name = self.api.model_name()
        # every model Parley loads takes pictures: said the ways chat clients look for it (Ollama's
        # capabilities list, OpenRouter's input modalities), so their image button is enabled
        models = (
            []
            if name is None
            else [
                {
                    "id": name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "parley",
                    "capabilities": ["completion", "vision"],
                    "architecture": {"input_modalities": ["text", "image"], "output_modalities": ["text"]},
                }
            ]
        )
        if wanted is None:
            return JSONResponse({"object": "list", "data": models})
        for m in models:
            if m["id"] == wanted:
                return JSONResponse(m)
        raise ApiError(404, f"The model {wanted!r} is not loaded.", "model", "model_not_found")

    async def _read_body(self, request: Request, state: dict) -> bytes:
        """The whole body, under the size limit, each part within `client_timeout_s` and the whole
        within `body_timeout_s` (a client that trickles its body is answered 408 and dropped)."""
        api = self.api
        te = request.headers.get("transfer-encoding")
        if te and te.lower() != "identity":
            raise ApiError(
                411, "Send the body with a Content-Length (chunked uploads are not supported).", None, "length_required"
            )
        if request.headers.get("content-length") is None:
            raise ApiError(411, "A Content-Length header is required.", None, "length_required")
        n = state["body_left"]
        if n > api.max_body_bytes:
            raise ApiError(
                413,
                f"The request body is too large ({n} bytes; the limit is {api.max_body_bytes}).",
                None,
                "body_too_large",
            )
        parts, got = [], 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + api.body_timeout_s
        while True:
            wait = min(api.client_timeout_s, deadline - loop.time())
            try:
                message = await asyncio.wait_for(request.receive(), max(wait, 0.0))
            except TimeoutError:
                state["body_left"] = 0  # nothing more is read from this client: answer, then close
                raise ApiError(
                    408,
                    f"The request body did not arrive in time (each part within "
                    f"{api.client_timeout_s:g} s, the whole within {api.body_timeout_s:g} s).",
                    None,
                    "request_timeout",
                    {"Connection": "close"},
                ) from None
            if message["type"] == "http.disconnect":
                raise ClientGone()
            part = message.get("body", b"")
            got += len(part)
            state["body_left"] = max(0, n - got)
            parts.append(part)
            if not message.get("more_body"):
                return b"".join(parts)

    async def _chat(self, request: Request, state: dict, send) -> None:
        api = self.api
        with api.admit():  # 429 (with Retry-After) when the queue is full, before the body is read
            raw = await self._read_body(request, state)
            loaded = api.engine.loaded
            if loaded is None:
                raise ApiError(503, "No model is loaded yet.", None, "model_not_loaded")
            # parsing, storing pictures and measuring the text run on a worker thread, never on the
            # event loop (other clients) or the model thread (every turn)
            req = await anyio.to_thread.run_sync(api.prepare, raw, loaded, limiter=api.prepare_limiter)
            del raw
            try:
                with api.open_turn(tokens=req.stream or bool(req.stops)) as (tid, q):
                    api.activity.begin(request.client.host if request.client else "")
                    try:
                        response = await self._answer(request, req, tid, q)
                        await response(request.scope, request.receive, send)  # the turn stays open meanwhile
                    finally:
                        api.activity.end()
            finally:
                req.hold.release()  # its pictures may be pruned from now on

    async def _answer(self, request: Request, req, tid: int, q):
        api = self.api
        api.engine.submit(Turn("", req.messages, req.sampling, None, tid))
        turn = ChatTurn(api, tid, q, req)
        watcher = asyncio.create_task(turn.watch_client(request.receive))
        try:
            if not req.stream:
                reply = await complete(turn)
                if reply is None:
                    if api.closing:
                        raise ApiError(503, "The API server is stopping.", None, "server_stopping")
                    raise ClientGone()
                return JSONResponse(reply)
            events = sse_events(turn)
            try:
                first = await anext(events)  # a failure before any text is a plain error status
            except StopAsyncIteration:
                raise ClientGone() from None
        finally:
            watcher.cancel()  # a streaming response watches for the client itself

        async def body():
            try:
                yield first
                async for data in events:
                    yield data
            except BaseException:
                if not turn.over:
                    turn.client_gone()  # cancelled: the client hung up mid-stream
                raise

        return StreamingResponse(
            body(),
            media_type="text/event-stream; charset=utf-8",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )


def _allow(method: str, allowed: str) -> None:
    if method != allowed:
        raise ApiError(
            405, f"Method {method} is not allowed here (use {allowed}).", None, "method_not_allowed", {"Allow": allowed}
        )


def _declared_body(request: Request) -> int:
    """Bytes of body the client said it will send (h11 has already refused a bad Content-Length);
    a chunked body counts as unknown but present."""
    te = request.headers.get("transfer-encoding")
    if te and te.lower() != "identity":
        return 1 << 62
    try:
        return max(0, int(request.headers.get("content-length") or 0))
    except ValueError:
        return 0
