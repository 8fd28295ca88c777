"""PDFs and videos sent to the API inline: a `file` content part (OpenAI's shape,
`{"type": "file", "file": {"file_data": "data:application/pdf;base64,...", "filename": ...}}`)
and a `video_url` part (vLLM's, `{"type": "video_url", "video_url": {"url": "data:video/mp4;base64,..."}}`).
Kept in the shared picture store as transient files like inline pictures, then typed by
engine/pictures/attach.py: a PDF's pages or a video's sampled frames become the message's pictures.
A bad one is a 400 with one sentence."""

from __future__ import annotations

from ..pictures.attach import attach
from ..pictures.file import PictureError
from ..pictures.ref import PictureRef, digest_of
from ..pictures.store import Hold, PictureSpaceError, PictureStore
from .errors import ApiError, bad

_VIDEO_EXT = {"video/mp4": ".mp4", "video/webm": ".webm", "video/quicktime": ".mov", "video/x-matroska": ".mkv"}


def file_part_url(part: dict, p: str) -> tuple[str, str, str]:
    """A `file` or `video_url` part -> (data URL, its parameter name, kind "file" | "video")."""
    if part["type"] == "file":
        f = part.get("file")
        url = f.get("file_data") if isinstance(f, dict) else None
        if not isinstance(url, str):
            raise bad(
                f"'{p}.file.file_data' must be a data URL string (data:application/pdf;base64,...).",
                f"{p}.file",
                "invalid_type",
            )
        return url, f"{p}.file.file_data", "file"
    vu = part.get("video_url")
    url = vu.get("url") if isinstance(vu, dict) else vu
    if not isinstance(url, str):
        raise bad(f"'{p}.video_url.url' must be a string.", f"{p}.video_url", "invalid_type")
    return url, f"{p}.video_url.url", "video"


def store_file_upload(
    store: PictureStore, data: bytes, mime: str, param: str, kind: str, hold: Hold | None = None
) -> list[PictureRef]:
    """Keep a PDF or video as a transient file and return its pages or frames as pictures."""
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
        return attach(store.path(name)).refs()
    except PictureError as exc:
        what = "PDF" if kind == "file" else "video"
        # the stored name is a digest, in the server's folder: say it as the client knows it
        said = str(exc).replace(str(store.path(name)), f"The {what}").replace(name, f"The {what}")
        raise bad(said, param, "invalid_file") from None
