"""A picture's first trip to the model: decode and the processor's per-picture step."""
from __future__ import annotations

from ..pictures.file import decode
from ..pictures.span import PictureKey
from .entry import PictureEntry


def preprocess(loaded, image) -> tuple[dict, str]:
    """One picture -> (model inputs for the encoder, placeholder replacement text).

    Uses the processor's own per-picture step so the expansion equals what the processor
    produces for the whole prompt.
    """
    images = [[image]] if loaded.family.nested_images else [image]
    # transformers' private per-picture step: no public call gives one picture's expansion
    processed, replacements = loaded.processor._process_images(images, **loaded.merged_kwargs["images_kwargs"])
    return dict(processed), replacements[0]


def prepare_entry(loaded, key: PictureKey, data: bytes, name: str) -> PictureEntry:
    """Decode + preprocess one picture into an entry that still needs encoding."""
    image = decode(data, name)
    processed, replacement = preprocess(loaded, image)
    grid = processed.get("image_grid_thw")
    grid_thw = [int(x) for x in grid[0].tolist()] if grid is not None else None
    return PictureEntry(
        key=key, replacement=replacement, n_tokens=replacement.count(loaded.processor.image_token),
        grid_thw=grid_thw, encoder_inputs=processed,
    )
