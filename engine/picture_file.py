"""Reading and checking a picture file: bytes and a full decode, with one sentence when it fails.

Torch-free, so the window checks a dropped picture with exactly the engine's rules."""
from __future__ import annotations

import io
from pathlib import Path

from PIL import Image, UnidentifiedImageError


MAX_PIXELS = 64_000_000  # beyond this a "picture" is almost surely a decompression bomb


class PictureError(ValueError):
    """A picture that cannot be used; the message names the file and says why."""


def read_bytes(path: str) -> bytes:
    p = Path(path)
    try:
        return p.read_bytes()
    except FileNotFoundError:
        raise PictureError(f"Picture not found: {p}") from None
    except IsADirectoryError:
        raise PictureError(f"Not a picture file (a folder): {p}") from None
    except OSError as exc:
        raise PictureError(f"Cannot read picture {p}: {exc.strerror or exc}") from None


def check(data: bytes, name: str) -> None:
    """The full decode without keeping the pixels (for the window and the API's upload check)."""
    _decode(data, name, rgb=False)


def decode(data: bytes, name: str) -> Image.Image:
    return _decode(data, name, rgb=True)


def _decode(data: bytes, name: str, rgb: bool) -> Image.Image | None:
    try:
        with Image.open(io.BytesIO(data)) as probe:
            w, h = probe.size
            if w * h > MAX_PIXELS:
                raise PictureError(f"{name} is too large ({w}×{h} pixels; the limit is {MAX_PIXELS // 1_000_000} megapixels)")
            probe.load()  # catches truncated files now, not inside the processor
            return probe.convert("RGB") if rgb else None
    except PictureError:
        raise
    except (UnidentifiedImageError, Image.DecompressionBombError):
        raise PictureError(f"{name} is not a picture (PNG, JPEG, WebP, GIF or BMP)") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise PictureError(f"{name} is a damaged picture ({exc})") from None
