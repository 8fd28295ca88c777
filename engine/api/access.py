"""Who may use the API: the bind rule (no network address without a token) and the per-request
check (the bearer token, or, without one, localhost-only Host and Origin headers)."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import socket
from urllib.parse import urlsplit

from .errors import ApiConfigError, ApiError


def _ip_is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%")[0]).is_loopback
    except ValueError:
        return False


def is_loopback(host: str) -> bool:
    """True when every address `host` names is a loopback address ("" and 0.0.0.0 are not)."""
    if not host:
        return False
    if _ip_is_loopback(host):
        return True
    try:
        ipaddress.ip_address(host.strip("[]"))
        return False  # a literal address that is not loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(infos) and all(_ip_is_loopback(str(info[4][0])) for info in infos)


def check_bind(host: str, token: str | None) -> None:
    """Refuse a network-reachable server without a token before anything is loaded."""
    if token is not None and (not token or any(c.isspace() for c in token)):
        raise ApiConfigError("The API token must be a non-empty string without spaces.")
    if not is_loopback(host) and not token:
        shown = host or "all interfaces"
        raise ApiConfigError(
            f"Refusing to serve the API on {shown}: that address is reachable from other machines, and "
            f"without a token anyone there could use the model. Pass --api-token (every request then needs "
            f"'Authorization: Bearer <token>'), or bind to 127.0.0.1."
        )


def _name_is_local(host: str | None) -> bool:
    if not host:
        return False
    h = host.lower().rstrip(".")
    return h == "localhost" or h.endswith(".localhost") or _ip_is_loopback(h)


def _host_header_name(value: str) -> str:
    value = value.strip()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class AccessCheck:
    """`check(headers, bound_host)` raises the ApiError a request that may not be served gets."""

    def __init__(self, token: str | None):
        # compared as digests so the comparison's time says nothing about the token's length
        self._token_digest = hashlib.sha256(token.encode()).digest() if token else None

    def check(self, headers, bound_host: str) -> None:
        if self._token_digest is not None:
            auth = headers.get("Authorization", "")
            scheme, _, given = auth.partition(" ")
            ok = scheme.lower() == "bearer" and hmac.compare_digest(
                hashlib.sha256(given.strip().encode()).digest(), self._token_digest
            )
            if not ok:
                raise ApiError(
                    401, "Missing or wrong API token: send 'Authorization: Bearer <token>'.", None, "invalid_api_key"
                )
            return
        # no token (loopback only): refuse what a web page could send, and DNS rebinding
        host = headers.get("Host")
        if host is not None and not _host_allowed(_host_header_name(host), bound_host):
            raise ApiError(
                403, f"Host {host!r} is not allowed; the API answers on localhost only.", None, "host_not_allowed"
            )
        origin = headers.get("Origin")
        if origin is not None and not _name_is_local(urlsplit(origin).hostname):
            raise ApiError(
                403, "Requests from web pages are not allowed without an API token.", None, "origin_not_allowed"
            )


def _host_allowed(name: str, bound_host: str) -> bool:
    if _name_is_local(name):
        return True
    local = {bound_host.lower(), socket.gethostname().lower()}
    return name.lower().rstrip(".") in local
