"""Reading and checking a picture file: bytes and a full decode, with one sentence when it fails.

Torch-free, so the window checks a dropped picture with exactly the engine's rules. The model
sees a picture the way a viewer shows it: its EXIF orientation is applied to the pixels (the
cache key stays over the original bytes, computed elsewhere without a decode)."""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from PIL import Image, ImageOps, UnidentifiedImageError

MAX_PIXELS = 64_000_000  # beyond this a "picture" is almost surely a decompression bomb
# A progressive JPEG is decoded scan by scan, each scan a pass over the whole picture (about
# 10 ms per megapixel on a 2-core EPYC), and Pillow has no limit on their number: 1,000 repeated
# scans of a 1 MP picture took 11 s. A camera's or mozjpeg's file has up to about 20.
MAX_JPEG_SCANS = 100
MAX_JPEG_SCAN_MEGAPIXELS = 2000  # scans × megapixels: a 64 MP picture of 31 scans, about 20 s here

# Our own limit is below PIL's warning threshold (~89 MP), so every picture PIL would warn about
# is refused here with one sentence; its warning would only leak past that sentence. (None would
# mean PIL's own limit is off, which nothing here does.)
assert Image.MAX_IMAGE_PIXELS is not None and MAX_PIXELS < Image.MAX_IMAGE_PIXELS
warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)


@dataclass(frozen=True)
class PictureType:
    name: str  # as people call it
    pillow: tuple[str, ...]  # Pillow's format ids for it
    mime: str
    extensions: tuple[str, ...]


# The one list of picture formats: refusals name them, the window's attach dialog offers them and a
# remote engine sends them with their MIME type.
PICTURE_TYPES = (
    PictureType("PNG", ("PNG",), "image/png", (".png",)),
    PictureType("JPEG", ("JPEG", "MPO"), "image/jpeg", (".jpg", ".jpeg")),  # MPO: a camera's JPEG with a preview
    PictureType("WebP", ("WEBP",), "image/webp", (".webp",)),
    PictureType("GIF", ("GIF",), "image/gif", (".gif",)),
    PictureType("BMP", ("BMP",), "image/bmp", (".bmp",)),
    PictureType("TIFF", ("TIFF",), "image/tiff", (".tif", ".tiff")),
)
PICTURE_NAMES = ", ".join(t.name for t in PICTURE_TYPES[:-1]) + f" or {PICTURE_TYPES[-1].name}"


class PictureError(ValueError):
    """A picture that cannot be used; the message names the file and says why."""


class Cancelled(Exception):
    """The person took a file back while it was being read (the window's intake)."""


@contextlib.contextmanager
def read_errors(path: str | Path, noun: str = ""):
    """An OSError while reading `path` becomes the one PictureError line that names it ("Picture
    not found: …" with noun "picture", "File not found: …" without)."""
    kind = f"{noun} " if noun else ""
    try:
        yield
    except FileNotFoundError:
        raise PictureError(f"{(noun or 'file').capitalize()} not found: {path}") from None
    except IsADirectoryError:
        raise PictureError(f"Not a {kind}file (a folder): {path}") from None
    except OSError as exc:
        raise PictureError(f"Cannot read {kind}{path}: {exc.strerror or exc}") from None


def read_bytes(path: str) -> bytes:
    p = Path(path)
    with read_errors(p, "picture"):
        return p.read_bytes()


def check(data: bytes, name: str) -> None:
    """The full decode without keeping the pixels (for the window and the API's upload check)."""
    _decode(data, name, lambda probe: None)


def decode(data: bytes, name: str) -> Image.Image:
    """RGB pixels, upright as shown (EXIF orientation applied)."""
    return _decode(data, name, _upright_rgb)


def _upright_rgb(probe: Image.Image) -> Image.Image:
    ImageOps.exif_transpose(probe, in_place=True)
    return probe.convert("RGB")


def jpeg_scans(data: bytes) -> int:
    """Start-of-scan markers in a JPEG: entropy-coded data never holds FF DA (a coded FF is
    followed by 00), so a count over the bytes is every scan (and a thumbnail's: an overcount)."""
    return data.count(b"\xff\xda")


def decode_work(data: bytes) -> int:
    """What decoding a picture costs, read from its header: pixels × scans (0: not a picture)."""
    try:
        with warnings.catch_warnings():  # a bomb's warning: the check itself refuses it
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as probe:
                w, h = probe.size
                scans = jpeg_scans(data) if probe.format in ("JPEG", "MPO") else 1
    except Exception:  # not a picture, damaged: the check itself says which
        return 0
    return w * h * max(1, scans)


def check_jpeg_scans(data: bytes, pixels: int, name: str) -> None:
    """Refuse, before decoding, a JPEG whose scans would take a decoder minutes."""
    scans = jpeg_scans(data)
    if scans > MAX_JPEG_SCANS or scans * pixels > MAX_JPEG_SCAN_MEGAPIXELS * 1_000_000:
        raise PictureError(
            f"{name} is a JPEG of {scans} scans, too many to decode (Parley decodes at most "
            f"{MAX_JPEG_SCANS}, fewer on large pictures); save it again as a plain JPEG"
        )


def _too_large(name: str, size: str) -> PictureError:
    return PictureError(f"{name} is too large ({size}; the limit is {MAX_PIXELS // 1_000_000} megapixels)")


_Kept = TypeVar("_Kept")


def _decode(data: bytes, name: str, keep: Callable[[Image.Image], _Kept]) -> _Kept:
    """Opens and fully loads the picture, then gives keep() the loaded image (still open) to take what it needs."""
    try:
        with Image.open(io.BytesIO(data)) as probe:
            w, h = probe.size
            if w * h > MAX_PIXELS:
                raise _too_large(name, f"{w}×{h} pixels")
            if probe.format in ("JPEG", "MPO"):
                check_jpeg_scans(data, w * h, name)
            probe.load()  # catches truncated files now, not inside the processor
            return keep(probe)
    except PictureError:
        raise
    except Image.DecompressionBombError:  # PIL refuses over ~178 MP before we can read the size
        pil_limit = Image.MAX_IMAGE_PIXELS
        assert pil_limit is not None  # PIL raises this only while its limit is set
        raise _too_large(name, f"over {2 * pil_limit // 1_000_000} megapixels") from None
    except UnidentifiedImageError:
        raise PictureError(f"{name} is not a picture ({PICTURE_NAMES})") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise PictureError(f"{name} is a damaged picture ({exc})") from None
