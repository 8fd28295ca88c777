"""How a page or frame of a stored file is named where only a name fits (a history message's
picture list, a chat thumbnail's source): the stored file's name and a fragment,
`<name>#p=<page>@<dpi>` for a page (0-based) and `<name>#t=<seconds>@<fps>/<max frames>` for a
frame. A plain picture's name has no fragment. Parsing validates every part. Torch-free."""

from __future__ import annotations

import re
from pathlib import Path

from .document import PageRef
from .ref import PictureRef
from .video import FrameRef, FrameSampling

_PAGE = re.compile(r"^p=(\d{1,5})@(\d{1,3})$")
_FRAME = re.compile(r"^t=(\d{1,6}(?:\.\d{1,3})?)@(\d{1,2}(?:\.\d{1,3})?)/(\d{1,3})$")


def split(name: str) -> tuple[str, str]:
    """'abc.pdf#p=3@144' -> ('abc.pdf', 'p=3@144'); a plain name -> (name, '')."""
    base, _, fragment = name.partition("#")
    return base, fragment


def check_fragment(fragment: str) -> None:
    if fragment and not (_PAGE.match(fragment) or _FRAME.match(fragment)):
        raise ValueError(f"not a page or frame: {fragment!r}")


def page_name(base: str, index: int, dpi: int) -> str:
    return f"{base}#p={index}@{dpi}"


def frame_name(base: str, t: float, sampling: FrameSampling) -> str:
    return f"{base}#t={t:g}@{sampling.fps:g}/{sampling.max_frames}"


def ref_at(path: str | Path, digest: str, fragment: str, name: str = "") -> PictureRef:
    """The picture a stored file (`digest` of its bytes, from its name) and a fragment stand for;
    `name`: what the person called the file (a page's or frame's caption says it)."""
    path = str(path)
    if not fragment:
        return PictureRef(path, digest, name=name)
    if m := _PAGE.match(fragment):
        return PageRef.of(path, digest, int(m[1]), int(m[2]), name)
    if m := _FRAME.match(fragment):
        return FrameRef.of(path, digest, float(m[1]), FrameSampling(float(m[2]), int(m[3])), name)
    raise ValueError(f"not a page or frame: {fragment!r}")


def preview(source: str, box: int):
    """A page's or frame's pixels within `box` × `box` for a thumbnail (`source`: a file path and
    fragment), drawn without the digest check an encode needs."""
    from .document import render_page
    from .ref import PixelLimit
    from .video import decode_frame

    base, fragment = split(source)
    limit = PixelLimit(longest_edge=box)
    if m := _PAGE.match(fragment):
        return render_page(base, int(m[1]), int(m[2]), limit, Path(base).name)
    if m := _FRAME.match(fragment):
        image = decode_frame(base, float(m[1]), Path(base).name)
        image.thumbnail((box, box))
        return image
    raise ValueError(f"not a page or frame: {fragment!r}")
