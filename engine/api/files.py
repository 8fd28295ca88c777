"""PDFs and videos sent to the API inline: a `file` content part (OpenAI's shape,
`{"type": "file", "file": {"file_data": "data:application/pdf;base64,...", "filename": ...}}`)
and a `video_url` part (vLLM's, `{"type": "video_url", "video_url": {"url": "data:video/mp4;base64,..."}}`).
Kept in the shared picture store as transient files like inline pictures, then typed by
engine/pictures/attach.py: a PDF's pages or a video's sampled frames become the message's pictures.
A PDF's `filename` names its pages as a dropped file's are named ("report.pdf, page 3"), in the
prompt too: only its last path part, without control characters, at most 120 characters.
A bad one is a 400 with one sentence."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, replace

from ..pictures.attach import attach
from ..pictures.file import PictureError
from ..pictures.ref import PictureRef, digest_of
from ..pictures.store import Hold, PictureSpaceError, PictureStore
from .errors import ApiError, bad

_VIDEO_EXT = {"video/mp4": ".mp4", "video/webm": ".webm", "video/quicktime": ".mov", "video/x-matroska": ".mkv"}


@dataclass(frozen=True)
class Upload:
    """One picture, PDF or video a message carries, as a data URL not yet decoded."""

    url: str
    param: str  # where it is in the request, for error messages ("messages[0].content[1].image_url.url")
    kind: str  # "image" | "file" (a PDF) | "video"
    name: str = ""  # the client's name for the file ("" : none given)


def file_part(part: dict, p: str) -> Upload:
    """A `file` or `video_url` content part, checked."""
    if part["type"] == "file":
        f = part.get("file")
        url = f.get("file_data") if isinstance(f, dict) else None
        if not isinstance(url, str):
            raise bad(
                f"'{p}.file.file_data' must be a data URL string (data:application/pdf;base64,...).",
                f"{p}.file",
                "invalid_type",
            )
        assert isinstance(f, dict)
        return Upload(url, f"{p}.file.file_data", "file", _file_name(f.get("filename"), f"{p}.file.filename"))
    vu = part.get("video_url")
    url = vu.get("url") if isinstance(vu, dict) else vu
    if not isinstance(url, str):
        raise bad(f"'{p}.video_url.url' must be a string.", f"{p}.video_url", "invalid_type")
    return Upload(url, f"{p}.video_url.url", "video")


def _file_name(value: object, param: str) -> str:
    """A client's file name as captions may say it: its last path part ("C:\\x\\a.pdf" -> "a.pdf"),
    control and format characters dropped, at most 120 characters; "" when none is given."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise bad(f"'{param}' must be a string.", param, "invalid_type")
    last = value.replace("\\", "/").rsplit("/", 1)[-1]
    clean = "".join(c for c in last if unicodedata.category(c) not in ("Cc", "Cf"))
    return " ".join(clean.split())[:120]


def store_file_upload(
    store: PictureStore, data: bytes, mime: str, upload: Upload, hold: Hold | None = None
) -> list[PictureRef]:
    """Keep a PDF or video as a transient file and return its pages or frames as pictures."""
    param, kind = upload.param, upload.kind
    if kind == "file" and not data.startswith(b"%PDF-"):
        raise bad("A file part must be a PDF (data:application/pdf;base64,...).", param, "invalid_file")
    ext = ".pdf" if kind == "file" else _VIDEO_EXT.get(mime, ".mp4")
    try:
        name = store.put(data, ext, transient=True, digest=digest_of(data), hold=hold)
    except PictureSpaceError as exc:
        if exc.too_big:
            raise ApiError(413, str(exc), param, "picture_too_large") from None
        raise ApiError(507, str(exc), param, "insufficient_storage", {"Retry-After": "1"}) from None
    try:
        stored = attach(store.path(name))
        return replace(stored, name=upload.name).refs(named=bool(upload.name))
    except PictureError as exc:
        what = "PDF" if kind == "file" else "video"
        # the stored name is a digest, in the server's folder: say it as the client knows it
        said = str(exc).replace(str(store.path(name)), f"The {what}").replace(name, f"The {what}")
        raise bad(said, param, "invalid_file") from None
