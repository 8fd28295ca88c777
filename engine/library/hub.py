"""Where the Hub and its cache are, and the Hub's errors turned into one line a user can act on.

Paths and the endpoint are read from the environment at call time (huggingface_hub reads them
once at import), so HF_HUB_CACHE / HF_HOME / HF_ENDPOINT set later are still honoured.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from ..platform.terminal import hide_credentials

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


class LibraryError(Exception):
    """Anything the library cannot do; str(exc) is the one line shown to the user."""


class NetworkUnreachable(LibraryError):
    pass


class AccessDenied(LibraryError):
    """401/403: gated or private repo without a (good) token."""


class NotFound(LibraryError):
    pass


class DiskFull(LibraryError):
    pass


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def shown_endpoint() -> str:
    """The endpoint as messages show it: without a user:password@ in it."""
    return hide_credentials(endpoint())


def hub_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def is_repo_id(text: str) -> bool:
    return bool(REPO_ID.match(text or ""))


def repo_folder(repo_id: str, cache: Path | None = None) -> Path:
    return (cache or hub_cache_dir()) / ("models--" + repo_id.replace("/", "--"))


def repo_url(repo_id: str) -> str:
    return f"{shown_endpoint()}/{repo_id}"


def offline_forced() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def translate(exc: BaseException, repo_id: str, revision: str | None = None) -> LibraryError:
    """huggingface_hub / httpx errors -> LibraryError with the repo URL and the HTTP status."""
    import httpx2
    from huggingface_hub import errors

    url = repo_url(repo_id)
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, LibraryError):
        return exc
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return DiskFull(
            f"disk full while downloading {repo_id} into {hub_cache_dir()}; free some space and "
            f"pull again (finished files are kept)"
        )
    if isinstance(exc, errors.OfflineModeIsEnabled):
        return NetworkUnreachable("network unreachable: offline mode is on (HF_HUB_OFFLINE)")
    if isinstance(exc, (httpx2.TransportError, ConnectionError, TimeoutError)):
        return NetworkUnreachable(f"network unreachable: cannot reach {shown_endpoint()} ({type(exc).__name__})")
    if isinstance(exc, errors.GatedRepoError) or status in (401, 403):
        what = "gated" if isinstance(exc, errors.GatedRepoError) else "private or gated"
        return AccessDenied(
            f"HTTP {status}: {repo_id} is {what}; accept its terms at {url} and "
            f"set a Hugging Face token with access to it"
        )
    if isinstance(exc, errors.RevisionNotFoundError):
        return NotFound(f"HTTP {status}: revision {revision!r} not found in {url}")
    if isinstance(exc, (errors.RepositoryNotFoundError, errors.RemoteEntryNotFoundError)) or status == 404:
        return NotFound(f"HTTP 404: {repo_id} not found at {url}")
    if status is not None:
        return LibraryError(f"HTTP {status} from {shown_endpoint()} for {repo_id}")
    return LibraryError(f"{repo_id}: {exc}")
