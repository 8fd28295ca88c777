"""Errors the API answers with, in OpenAI's error shape."""

from __future__ import annotations

import re

# An absolute path in a message (POSIX, or Windows with a drive), up to its last part: a client
# learns nothing of the server's folders (the data folder, a user's name in it), only the file's
# name. Not inside a URL or a word ("and/or").
_PATH = re.compile(r"(?<![\w.:/\\])(?:/|[A-Za-z]:\\)(?:[^\s/\\'\"(),;]+[/\\])+(?=[^\s/\\'\"(),;])")


def without_paths(message: str) -> str:
    """`message` with every absolute path cut to its last part ("/srv/data/pictures/ab/x.png" -> "x.png")."""
    return _PATH.sub("", message)


_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    411: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
    507: "server_error",
}


class ApiError(Exception):
    """A request the API answers with an HTTP error and OpenAI's `{"error": {...}}` body."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})  # extra response headers (Allow, Retry-After, WWW-Authenticate)

    def body(self) -> dict:
        return {
            "error": {
                "message": without_paths(self.message),
                "type": _TYPES.get(self.status, "invalid_request_error"),
                "param": self.param,
                "code": self.code,
            }
        }


class ClientGone(Exception):
    """The client hung up mid-request: nothing more is sent on its connection."""


class ApiConfigError(ValueError):
    """The server cannot be started as asked (e.g. a network bind without a token)."""


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param, code)
