"""Reading a picture file for the encoder: bytes, decode, the processor's per-picture step."""
from __future__ import annotations

import io
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from .entry import PictureEntry

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


def decode(data: bytes, name: str) -> Image.Image:
    try:
        with Image.open(io.BytesIO(data)) as probe:
            w, h = probe.size
            if w * h > MAX_PIXELS:
                raise PictureError(f"{name} is too large ({w}×{h} pixels)")
            probe.load()  # catches truncated files now, not inside the processor
            return probe.convert("RGB")
    except PictureError:
        raise
    except (UnidentifiedImageError, Image.DecompressionBombError):
        raise PictureError(f"{name} is not a picture Parley can read (PNG, JPEG, WebP, GIF, BMP …)") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise PictureError(f"{name} is a damaged picture: {exc}") from None


def prepare_entry(loaded, key: bytes, data: bytes, name: str) -> PictureEntry:
    """Decode + preprocess one picture into an entry that still needs encoding."""
    image = decode(data, name)
    processed, replacement = loaded.adapter.preprocess(
        loaded.processor, loaded.merged_kwargs["images_kwargs"], image
    )
    grid = processed.get("image_grid_thw")
    grid_thw = [int(x) for x in grid[0].tolist()] if grid is not None else None
    return PictureEntry(
        key=key, replacement=replacement, n_tokens=replacement.count(loaded.processor.image_token),
        grid_thw=grid_thw, encoder_inputs=processed,
    )
