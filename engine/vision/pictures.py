"""A picture's first trip to the model: decode and the processor's per-picture step."""
from __future__ import annotations

from ..pictures.file import decode
from ..pictures.span import PictureKey
from .entry import PictureEntry


def prepare_entry(loaded, key: PictureKey, data: bytes, name: str) -> PictureEntry:
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
