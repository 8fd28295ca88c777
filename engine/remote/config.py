"""Where a remote engine talks to: the server's base URL, its API key, the model name."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from ..platform.terminal import hide_credentials

# a server slower than this per token is not one a person waits on (llama.cpp runs a 70B model on a CPU at ~1)
SLOWEST_TOKEN_S = 2.0


class RemoteConfigError(ValueError):
    """A server address that cannot be used; the message says why in one sentence."""


def normalize_base_url(url: str) -> str:
    """`host:8000`, `http://host:8000`, `http://host:8000/` and `http://host:8000/v1/` all mean
    the same server: people paste the URL with and without the trailing /v1. Returns the URL
    ending in /v1, which is what the openai client wants as its base."""
    text = (url or "").strip()
    if not text:
        raise RemoteConfigError("No server address given (e.g. http://gpu-box:8000/v1).")
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise RemoteConfigError(f"A server address starts with http:// or https://, not {parts.scheme}:// ({url}).")
    if not parts.hostname:
        raise RemoteConfigError(f"The server address has no host name: {url}")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise RemoteConfigError(f"The server address has a bad port: {url}") from None
    path = parts.path.rstrip("/")
    for tail in ("/chat/completions", "/models"):  # a pasted endpoint still names its server
        if path.endswith("/v1" + tail):
            path = path[: -len(tail)]
    if not path.endswith("/v1"):
        path += "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


@dataclass(frozen=True)
class RemoteConfig:
    base_url: str  # normalized: ends in /v1
    model: str = ""  # "" = the first model the server lists
    api_key: str = ""  # sent as 'Authorization: Bearer KEY'; never in a repr or log
    timeout_s: float = 600.0  # a big model's long prefill can take minutes before the first token
    connect_timeout_s: float = 10.0
    stream: bool = True
    total_timeout_s: float | None = None  # the whole request; None: total_s(max_tokens)

    def total_s(self, max_tokens: int) -> float:
        """How long one request may take in all: the first token's wait, then SLOWEST_TOKEN_S a
        token (a stream the read timeout alone never ends, since every byte restarts it)."""
        if self.total_timeout_s is not None:
            return self.total_timeout_s
        return self.timeout_s + max_tokens * SLOWEST_TOKEN_S

    @classmethod
    def make(cls, url: str, model: str = "", api_key: str = "", **kw) -> RemoteConfig:
        return cls(normalize_base_url(url), (model or "").strip(), (api_key or "").strip(), **kw)

    def __repr__(self) -> str:  # logs and tracebacks show this: no key, no user:password@
        return (
            f"RemoteConfig(base_url={self.shown_url!r}, model={self.model!r}, stream={self.stream}, "
            f"timeout_s={self.timeout_s})"
        )

    @property
    def server(self) -> str:
        """The address people recognise: scheme://host:port (no /v1, no user:password@)."""
        return self.shown_url[: -len("/v1")] if self.shown_url.endswith("/v1") else self.shown_url

    @property
    def shown_url(self) -> str:
        """base_url as it may be shown or logged: without a user:password@ in it."""
        return hide_credentials(self.base_url)
