"""A picture as it crosses the engine boundary: where its file is and what its bytes hash to.

The digest (BLAKE3 hex of the file's original bytes) is computed once, where the picture comes
in (the window's import, the API's upload, `ask --image`, a replay script); the engine keys its
image cache by it and reads the file only when it must encode the picture, checking the bytes
still hash to the digest."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import blake3

from .file import PictureError, read_bytes


@dataclass(frozen=True)
class PictureRef:
    path: str  # the picture file (read only when the picture must be encoded)
    digest: str  # BLAKE3 hex of the file's original bytes

    def __post_init__(self):
        if not (isinstance(self.digest, str) and len(self.digest) == 64
                and all(c in "0123456789abcdef" for c in self.digest)):
            raise ValueError(f"not a picture digest (64 lowercase hex digits): {self.digest!r}")

    @classmethod
    def of_file(cls, path: str | Path) -> PictureRef:
        """Hash a file the user named (one clear PictureError when it is missing or unreadable)."""
        return cls(str(path), digest_of(read_bytes(str(path))))

    def read_checked(self) -> bytes:
        """The file's bytes, refused with one sentence when they no longer match the digest."""
        data = read_bytes(self.path)
        if digest_of(data) != self.digest:
            raise PictureError(f"The picture {Path(self.path).name} changed on disk after it was attached; "
                               "attach it again.")
        return data


def digest_of(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


def as_refs(images) -> list[PictureRef]:
    """Plain paths typed by a user (the command line, a replay script) -> refs, each file hashed once."""
    return [p if isinstance(p, PictureRef) else PictureRef.of_file(p) for p in images]
