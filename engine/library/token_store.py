"""The Hugging Face token for gated/private repos: the OS keyring when one works, else the file
huggingface_hub itself uses (HF_HOME/token, shared with `hf auth login`)."""

from __future__ import annotations

import os
from pathlib import Path

SERVICE = "parley-huggingface"
ACCOUNT = "token"


def os_keyring():
    """The keyring module when a real backend answers (not the 'fail' or null ones)."""
    try:
        import keyring
        from keyring.backends import fail
    except ImportError:
        return None
    backend = keyring.get_keyring()
    if isinstance(backend, fail.Keyring) or getattr(backend, "priority", 1) <= 0:
        return None
    return keyring


def token_file() -> Path:
    from .hub import hub_cache_dir

    if os.environ.get("HF_TOKEN_PATH"):
        return Path(os.environ["HF_TOKEN_PATH"]).expanduser()
    home = os.environ.get("HF_HOME")
    return (Path(home).expanduser() if home else hub_cache_dir().parent) / "token"


def where() -> str:
    """Where a saved token lives, in words for the settings line."""
    kr = os_keyring()
    return f"the OS keyring ({type(kr.get_keyring()).__name__})" if kr else f"the file {token_file()}"


def save_token(token: str) -> str:
    token = token.strip()
    kr = os_keyring()
    if kr is not None:
        kr.set_password(SERVICE, ACCOUNT, token)
    else:
        path = token_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        if hasattr(os, "fchmod"):  # a file that was there keeps its mode through open(): tighten it
            os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)
    return where()


def load_token() -> str | None:
    """HF_TOKEN from the environment first (as huggingface_hub does), then the saved one."""
    if os.environ.get("HF_TOKEN"):
        return os.environ["HF_TOKEN"].strip()
    kr = os_keyring()
    if kr is not None:
        value = kr.get_password(SERVICE, ACCOUNT)
        if value:
            return value
    try:
        return token_file().read_text().strip() or None
    except OSError:
        return None
