"""Values a hub sends (and the revision a person types), checked where they enter the library.

Each becomes part of a path in the HF cache (snapshots/<commit>/<name>, blobs/<sha256 or blob
id>, refs/<revision>), so each is refused with one sentence unless it has the one form the Hub
gives it: a commit is 40 hex digits, a sha256 64, a git blob id 40; a name is relative, without
`..`, `\\`, a drive letter or control characters. `inside()` is the last check before a path is
created (what Ollama added after CVE-2024-37032). `Digest` is what a file's bytes are verified
against: the sha256 the Hub lists for an LFS file, the git blob id for any other.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .hub import LibraryError

_HEX40 = re.compile(r"[0-9a-f]{40}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DRIVE = re.compile(r"^[A-Za-z]:")
MAX_NAME_CHARS = 1024
MAX_FILE_BYTES = 1 << 50  # 1 PiB: a listed size beyond this is not a file


class HubValueError(LibraryError):
    """A value from the hub (or a revision) that Parley refuses to turn into a path."""


def _refuse(what: str, value, why: str) -> HubValueError:
    return HubValueError(f"refused: the hub sent {what} {value!r}, {why}; nothing was written")


def is_commit_id(value) -> bool:
    return isinstance(value, str) and _HEX40.fullmatch(value) is not None


def commit_id(value) -> str:
    if not is_commit_id(value):
        raise _refuse("the commit id", value, "not 40 lowercase hex digits")
    return value


def content_sha256(value, name: str) -> str:
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise _refuse(f"the sha256 of {name!r} as", value, "not 64 lowercase hex digits")
    return value


def git_blob_id(value, name: str) -> str:
    if not isinstance(value, str) or not _HEX40.fullmatch(value):
        raise _refuse(f"the git blob id of {name!r} as", value, "not 40 lowercase hex digits")
    return value


def file_size(value, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_FILE_BYTES:
        raise _refuse(f"the size of {name!r} as", value, "not a byte count")
    return value


def _path_problem(value) -> str | None:
    """Why `value` cannot be a relative path inside a folder (None: it can)."""
    if not isinstance(value, str) or not value:
        return "not a name"
    if len(value) > MAX_NAME_CHARS:
        return f"longer than {MAX_NAME_CHARS} characters"
    if _CONTROL.search(value):
        return "a name with control characters"
    if "\\" in value:
        return "a name with a backslash (a folder separator on Windows)"
    if value.startswith("/") or _DRIVE.match(value) or ":" in value:
        return "an absolute path, a drive letter or a name with ':'"
    if any(part in ("", ".", "..") for part in value.split("/")):
        return "a name with an empty, '.' or '..' part"
    return None


def file_name(value) -> str:
    why = _path_problem(value)
    if why:
        raise _refuse("the file name", value, why)
    return value


def revision(value) -> str:
    """A branch, tag or commit as a person gives it (`--revision`): it names a file under refs/."""
    why = _path_problem(value)
    if why:
        raise HubValueError(f"refused: the revision {value!r} is {why}")
    return value


def inside(root: Path, path: Path) -> Path:
    """`path` when it lies under `root` (links in what exists already followed), else refused."""
    top = os.path.realpath(root)
    real = os.path.realpath(path)
    if not real.startswith(top.rstrip(os.sep) + os.sep):
        raise HubValueError(f"refused: {path} would be written outside the cache {root}; nothing was written")
    return path


@dataclass(frozen=True)
class Digest:
    """What a downloaded file's bytes must hash to: the sha256 of an LFS file, or the git blob
    id (SHA-1 of `blob <size>\\0` + bytes) of any other file. `hex` names its blob in the cache."""

    kind: str  # "sha256" | "git-sha1"
    hex: str

    def __post_init__(self):
        pattern = {"sha256": _HEX64, "git-sha1": _HEX40}.get(self.kind)
        if pattern is None or not pattern.fullmatch(self.hex):
            raise ValueError(f"not a {self.kind} digest: {self.hex!r}")

    @property
    def label(self) -> str:
        return "SHA-256" if self.kind == "sha256" else "git SHA-1"

    def hasher(self, size: int):
        """A fresh hash object for a file of `size` bytes (git's blob header is fed first)."""
        if self.kind == "sha256":
            return hashlib.sha256()
        h = hashlib.sha1(usedforsecurity=False)
        h.update(b"blob %d\0" % size)
        return h
