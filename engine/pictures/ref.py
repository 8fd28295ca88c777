"""A picture as it crosses the engine boundary: where its file is and what its bytes hash to.

The digest (BLAKE3 hex of the file's original bytes) is computed once, where the picture comes
in (the window's import, the API's upload, `ask --image`, a replay script); the engine keys its
image cache by it and reads the file only when it must encode the picture, checking the bytes
still hash to the digest.

A page of a document (engine/pictures/document.py: PageRef) and a frame of a video
(engine/pictures/video.py: FrameRef) are PictureRefs too: their `digest` is derived from the
file's digest, the page or timestamp and the render or sampling settings, so the cache finds
them without opening the file; only `picture()` (a cache miss) reads, renders or decodes."""

from __future__ import annotations

import os
import threading
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import blake3

from .file import Cancelled, PictureError, decode, read_bytes, read_errors

_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class PixelLimit:
    """The most of a picture the model's processor uses (engine/vision/pictures.py reads it from
    the processor): a page is rendered, a frame scaled, to no more than this. None: no limit."""

    max_pixels: int | None = None  # area (Qwen2-VL family)
    longest_edge: int | None = None
    shortest_edge: int | None = None  # resized so its short side is this (then cropped)

    def scale_for(self, width: float, height: float) -> float:
        """The factor (at most 1) that brings a width × height picture within the limit."""
        s = 1.0
        if self.max_pixels and width * height > self.max_pixels:
            s = min(s, (self.max_pixels / (width * height)) ** 0.5)
        if self.longest_edge and max(width, height) > self.longest_edge:
            s = min(s, self.longest_edge / max(width, height))
        if self.shortest_edge and min(width, height) > self.shortest_edge:
            s = min(s, self.shortest_edge / min(width, height))
        return s


@dataclass(frozen=True)
class PictureRef:
    path: str  # the picture file (read only when the picture must be encoded)
    digest: str  # BLAKE3 hex of the file's original bytes
    # what the person called the file it came from ("" : unnamed). The window keeps a copy under
    # its digest, so `path` does not say it; a page's or frame's caption does. Not part of the
    # picture's identity: the same bytes are the same picture, whatever the file was called.
    name: str = field(default="", compare=False, kw_only=True)

    def __post_init__(self):
        if not (isinstance(self.digest, str) and len(self.digest) == 64 and set(self.digest) <= _HEX):
            raise ValueError(f"not a picture digest (64 lowercase hex digits): {self.digest!r}")

    @classmethod
    def of_file(cls, path: str | Path) -> PictureRef:
        """Hash a file the user named (one clear PictureError when it is missing or unreadable)."""
        return cls(str(path), digest_of(read_bytes(str(path))))

    def named(self, name: str) -> PictureRef:
        """The same picture, its source file called `name`."""
        return replace(self, name=name)

    @property
    def file_name(self) -> str:
        """The name of the file it came from: the one the person used, else the path's own."""
        return self.name or Path(self.path).name

    @property
    def label(self) -> str:
        """How a person names this picture in a sentence."""
        return self.file_name

    @property
    def modality(self) -> str:
        """How the model takes it: "image", or "video" (a clip of frames, engine/pictures/video.py)."""
        return "image"

    @property
    def clip_key(self) -> tuple | None:
        """Frames of the same video and sampling share this (None: not a frame): a family with
        native video input takes a run of them as one video."""
        return None

    @property
    def members(self) -> tuple[PictureRef, ...]:
        """The pictures a person attached that this one stands for (a clip: its frames)."""
        return (self,)

    @property
    def caption(self) -> str | None:
        """What the picture is, in words the chat shows under it and the model reads just before
        it ("report.pdf, page 3", "clip.mp4, frame at 0:12"; unnamed: "Page 3"); None for a plain
        picture, whose prompt stays as it always was."""
        return None

    @property
    def prompt_caption(self) -> str | None:
        """The caption as the prompt has it, just before the picture."""
        caption = self.caption
        return f"{caption}:" if caption else None

    def read_checked(self) -> bytes:
        """The picture file's bytes (a page or frame: PNG of it), refused with one sentence when
        the file no longer matches its digest."""
        data = read_bytes(self.path)
        if digest_of(data) != self.digest:
            raise PictureError(f"The picture {self.label} changed on disk after it was attached; attach it again.")
        return data

    def picture(self, limit: PixelLimit | None = None):
        """RGB pixels to encode (a plain picture as it is: its processor resizes it)."""
        return decode(self.read_checked(), self.label)


def spoken_name(name: str, limit: int = 120) -> str:
    """A file's name as a caption says it: one line (no control or format characters), no angle
    brackets (a name like "<image>.pdf" must not read as a chat template's marker), at most
    `limit` characters (the middle cut)."""
    said = "".join(" " if unicodedata.category(c)[0] in "CZ" else c for c in name)
    said = " ".join(said.split()).replace("<", "‹").replace(">", "›")
    if len(said) > limit:
        said = said[: limit // 2 - 1] + "…" + said[-(limit - limit // 2) :]
    return said


def captioned(name: str, what: str) -> str:
    """A caption: "report.pdf, page 3" for a named file, "Page 3" for an unnamed one."""
    said = spoken_name(name)
    return f"{said}, {what}" if said else what[:1].upper() + what[1:]


def digest_of(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


def derived_digest(domain: bytes, source_digest: str, *parts: object) -> str:
    """The digest of a picture made from a file (a page, a frame): BLAKE3 over a domain tag, the
    file's digest and the settings that make the picture, each part length-prefixed."""
    h = blake3.blake3(domain)
    h.update(bytes.fromhex(source_digest))
    for p in parts:
        b = str(p).encode()
        h.update(len(b).to_bytes(4, "little") + b)
    return h.hexdigest()


_checked: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> digest seen this run
_checked_lock = threading.Lock()


def file_digest(path: str, cancelled: Callable[[], bool] | None = None, chunk: int = 8 << 20) -> str:
    """BLAKE3 hex of a file read in pieces (a video may be gigabytes: memory stays bounded);
    Cancelled between pieces once `cancelled()` says so."""
    h = blake3.blake3()
    with read_errors(path), open(path, "rb") as f:
        while block := f.read(chunk):
            if cancelled is not None and cancelled():
                raise Cancelled(path)
            h.update(block)
    return h.hexdigest()


def check_file_digest(path: str, digest: str, label: str) -> None:
    """Refuse a document or video that changed since it was attached. Hashed once per run while
    its size and time stamp stay the same, so the pages of one miss-turn hash it once."""
    try:
        st = os.stat(path)
    except OSError:
        raise PictureError(f"{label}: the file is gone; attach it again.") from None
    stamp = (path, st.st_size, st.st_mtime_ns)
    with _checked_lock:
        if _checked.get(stamp) == digest:
            return
    if file_digest(path) != digest:
        raise PictureError(f"{label}: the file changed on disk after it was attached; attach it again.")
    with _checked_lock:
        _checked[stamp] = digest


def as_refs(images) -> list[PictureRef]:
    """Plain paths typed by a user (the command line, a replay script) -> refs, each file hashed once."""
    return [p if isinstance(p, PictureRef) else PictureRef.of_file(p) for p in images]
