"""A model's config.json for the fit estimate: from the installed snapshot when there is one,
else fetched from the Hub into memory (remembered for this process; it is small)."""

from __future__ import annotations

from functools import lru_cache

from . import repo_check
from .hub import NetworkUnreachable


@lru_cache(maxsize=256)
def _fetched_config(repo_id: str, token: str | None) -> dict | None:
    from .pull import fetch_json

    return fetch_json(repo_id, "config.json", "main", token)


def remote_config(repo_id: str, installed=None, offline: bool = False, token: str | None = None) -> dict | None:
    """config.json of `repo_id`; raises NetworkUnreachable when it has to ask and cannot."""
    if installed is not None:
        config = repo_check.read_json(installed.snapshot / "config.json")
        if config is not None:
            return config
    if offline:
        raise NetworkUnreachable("network unreachable: not asked (offline); installed models only")
    return _fetched_config(repo_id, token)
