"""Every way a request to a server can fail, as one sentence a person can act on."""

from __future__ import annotations

import socket
import ssl
from typing import TYPE_CHECKING

from .config import RemoteConfig

if TYPE_CHECKING:
    import openai


def _chain(exc: BaseException | None):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _server_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error", body)
        msg = err.get("message") if isinstance(err, dict) else err if isinstance(err, str) else None
        if not msg and isinstance(body.get("detail"), str):  # FastAPI-style servers
            msg = body["detail"]
        if isinstance(msg, str) and msg.strip():
            return msg.strip()
    return ""


def _is_api_body(exc: openai.APIStatusError) -> bool:
    """Whether the error came as JSON, as an OpenAI-compatible server sends it (an HTML page
    or plain text means something else answered at that address)."""
    ctype = exc.response.headers.get("content-type", "") if exc.response is not None else ""
    return "json" in ctype.lower()


def connection_failure(exc: BaseException, cfg: RemoteConfig) -> str:
    where = cfg.server
    for e in _chain(exc):
        if isinstance(e, socket.gaierror):
            return f"Cannot find the server {where}: its host name does not resolve (DNS lookup failed)."
        if isinstance(e, ssl.SSLCertVerificationError):
            return f"TLS error with {where}: its certificate is not trusted ({e.verify_message or e.reason})."
        if isinstance(e, ssl.SSLError):
            return f"TLS error with {where} ({e.reason or e}); check http:// versus https:// in the server address."
        if isinstance(e, ConnectionRefusedError):
            return f"Cannot reach the server at {where}: connection refused (is the server running on that port?)."
    for e in _chain(exc):
        if "ssl" in type(e).__name__.lower() or "tls" in str(e).lower()[:40]:
            return f"TLS error with {where}: {e}"
    detail = next((str(e) for e in _chain(exc) if str(e) and e is not exc), "") or str(exc)
    return f"Cannot reach the server at {where} ({detail})."


def describe(exc: BaseException, cfg: RemoteConfig, during: str = "request", model: str | None = None) -> str:
    """One line for a failed request (`during`: 'request' before any reply text, 'stream' once
    reply text has arrived; `model`: the name the request asked for)."""
    import openai  # loaded already: whatever raised `exc` used it (not at import: see engine.make_client)

    where = cfg.server
    if isinstance(exc, openai.APITimeoutError):
        if during == "stream":
            return (
                f"The server at {where} stopped sending mid-reply (nothing for {cfg.timeout_s:.0f} s); "
                "the partial reply is kept."
            )
        return f"The server at {where} did not answer within {cfg.timeout_s:.0f} s."
    if isinstance(exc, openai.APIConnectionError):
        if during == "stream":
            return f"The connection to {where} dropped mid-reply; the partial reply is kept."
        return connection_failure(exc, cfg)
    if isinstance(exc, openai.APIStatusError):
        code = exc.status_code
        said = _server_message(exc)
        tail = f": {said.rstrip('.')}" if said else ""
        if not _is_api_body(exc) and code in (404, 405, 501):
            return (
                f"The server at {where} is not an OpenAI-compatible API (HTTP {code} to "
                f"POST {cfg.shown_url}/chat/completions)."
            )
        if code == 401:
            return f"The server at {where} refused the API key (401){tail}. Check the key in Settings."
        if code == 403:
            return f"The server at {where} denied access (403){tail}."
        if code == 404:
            return f"The server at {where} has no model named {model or cfg.model!r} (404){tail}."
        if code == 413:
            return (
                f"The server at {where} refused the request as too large (413){tail}. Send fewer or smaller pictures."
            )
        if code == 429:
            return f"The server at {where} is busy (429){tail}. Try again in a moment."
        if 400 <= code < 500:
            return f"The server at {where} rejected the request ({code}){tail}."
        return f"The server at {where} failed on this turn ({code}){tail}."
    if isinstance(exc, openai.APIResponseValidationError):
        return f"The server at {where} answered in a form Parley cannot read (not OpenAI-compatible)."
    if isinstance(exc, openai.APIError):  # an error event inside the stream
        return f"The server at {where} reported an error{' mid-reply' if during == 'stream' else ''}: {exc.message}"
    return f"The request to {where} failed ({type(exc).__name__}: {exc})."
