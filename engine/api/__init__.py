"""OpenAI-compatible local HTTP API on the running Engine (no Qt here).

`ApiServer` is imported on first use (its web stack takes ~1 s to import), so the window, which
offers the server but seldom runs it, starts without it."""

from .access import check_bind, is_loopback
from .activity import ApiActivity
from .errors import ApiConfigError, ApiError

__all__ = ["ApiActivity", "ApiConfigError", "ApiError", "ApiServer", "check_bind", "is_loopback"]


def __getattr__(name: str):
    if name == "ApiServer":
        from .server import ApiServer

        return ApiServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
