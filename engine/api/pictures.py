"""Pictures sent inline as data: URLs: decoded here, kept in the one picture store
(engine/pictures/store.py) under `<data_dir>/pictures/`, holding the client's bytes unchanged,
so a re-sent picture — or one the window imported — is the same file and the engine's image
cache (keyed by its content digest) finds it. The API's pictures are transient there:
size-capped and aged out, never at the cost of a picture a conversation keeps.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import re
from pathlib import Path

from PIL import Image

from ..pictures.file import PictureError, check
from ..pictures.ref import PictureRef, digest_of
from ..pictures.store import NAME_RE, Hold, PictureSpaceError, PictureStore
from ..platform.files import is_temp_name
from .errors import ApiError, bad

_DATA_URL = re.compile(r"^data:([^;,]*)((?:;[^;,]*)*),", re.IGNORECASE)
_WS = re.compile(rb"\s+")
_EXT = {"PNG": "png", "JPEG": "jpg", "WEBP": "webp", "GIF": "gif", "BMP": "bmp", "TIFF": "tiff", "MPO": "jpg"}


def decode_data_url(url: str, param: str, accept: str = "image/") -> bytes:
    """`data:image/...;base64,...` -> bytes; anything else is a clear 400. `accept`: the MIME
    prefix a part of this kind must name when it names one ("application/pdf", "video/")."""
    low = url[:16].lower()
    if low.startswith(("http://", "https://")):
        raise bad(
            "Parley does not fetch remote images: send the picture inline as a data URL (data:image/png;base64,...).",
            param,
            "remote_image_refused",
        )
    m = _DATA_URL.match(url)
    if m is None:
        raise bad("An image_url must be a data URL (data:image/png;base64,...).", param, "invalid_image_url")
    mime, params = m.group(1).strip().lower(), m.group(2).lower()
    if "base64" not in [p.strip() for p in params.split(";")]:
        raise bad("An image data URL must be base64-encoded (data:image/png;base64,...).", param, "invalid_image_url")
    if mime and not mime.startswith(accept):
        what = {"image/": "a picture", "application/pdf": "a PDF", "video/": "a video"}.get(accept, accept)
        raise bad(f"The payload is not {what} (its data URL says {mime!r}).", param, "invalid_image")
    payload = _WS.sub(b"", url[m.end() :].encode("ascii", "replace"))
    payload += b"=" * (-len(payload) % 4)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise bad("The picture's base64 data cannot be decoded.", param, "invalid_base64") from None
    if not data:
        raise bad("The picture's data is empty.", param, "invalid_image")
    return data


def data_url_mime(url: str) -> str:
    m = _DATA_URL.match(url)
    return m.group(1).strip().lower() if m else ""


def store_upload(store: PictureStore, data: bytes, param: str, hold: Hold | None = None) -> PictureRef:
    """Keep a client's picture in the shared store as a transient one (size-capped, aged out)
    and return its ref; `hold` keeps it until the request's turn is over. A payload is fully
    decoded once, the first time its content is seen; a picture already stored (by the API or
    the window) costs one hash and one touch. No room: 413 (larger than the cap) or 507."""
    digest = digest_of(data)
    name = store.find(digest)
    if name is None:
        try:
            fmt = Image.open(io.BytesIO(data)).format or ""
        except Exception:
            fmt = ""
        try:
            check(data, "The picture")  # a payload that is not a picture (or is damaged) -> 400
        except PictureError as exc:
            raise bad(str(exc), param, "invalid_image") from None
        name = digest + "." + _EXT.get(fmt.upper(), fmt.lower() or "bin")
    try:
        return store.ref(store.put(data, name[64:], transient=True, digest=digest, hold=hold))
    except PictureSpaceError as exc:
        if exc.too_big:
            raise ApiError(413, str(exc), param, "picture_too_large") from None
        raise ApiError(507, str(exc), param, "insufficient_storage", {"Retry-After": "1"}) from None


def drop_legacy_folder(data_dir: Path) -> int:
    """Older versions kept the API's pictures apart, in `<data_dir>/api-pictures/`: only copies
    of what clients sent (they send them again each turn), so at start they go. -> files deleted."""
    folder, gone = Path(data_dir) / "api-pictures", 0
    try:
        entries = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return 0
    for entry in entries:
        if entry.is_file(follow_symlinks=False) and (NAME_RE.match(entry.name) or is_temp_name(entry.name)):
            try:
                os.unlink(entry.path)
                gone += 1
            except OSError:  # left for the next start; serving does not wait on it
                pass
    try:
        folder.rmdir()
    except OSError:  # something of the user's is in there: leave it
        pass
    return gone
