"""What a picture costs to know: its content key and its cache entry."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import blake3
import torch

from ..pictures.span import PictureKey

# v2: keyed by the content digest carried in the PictureRef (v1 hashed the file's bytes each
# turn); the new tag keeps v1 entries on disk from ever being read under a v2 key.
KEY_DOMAIN = b"parley.picture.v2\0"


@dataclass
class PictureEntry:
    key: PictureKey
    replacement: str  # the placeholder's expansion text (what the processor would insert)
    n_tokens: int  # feature rows = image tokens in the expansion
    grid_thw: list[int] | None = None  # Qwen2-VL family: needed for 3-D positions
    modality: str = "image"  # "video": a clip through the processor's video path (its own token)
    second_per_grid: float | None = None  # Qwen2.5-VL video: seconds per temporal patch (positions)
    features: torch.Tensor | None = None  # post-projector features, [n_tokens, hidden], on CPU
    encoder_inputs: dict | None = field(default=None, repr=False)  # decoded pixels, this turn only

    @property
    def nbytes(self) -> int:
        return 0 if self.features is None else self.features.numel() * self.features.element_size()

    def meta(self) -> dict:
        return {
            "replacement": self.replacement,
            "n_tokens": self.n_tokens,
            "grid_thw": self.grid_thw,
            "modality": self.modality,
            "second_per_grid": self.second_per_grid,
        }


def encoder_identity(loaded) -> bytes:
    """Vision weights identity + processor config + dtype: features are only valid for this triple."""
    h = blake3.blake3()
    h.update(loaded.fingerprint)
    ip = loaded.processor.image_processor
    try:
        cfg = ip.to_json_string()
    except Exception:  # some processors hold non-JSON values; their repr is still stable
        cfg = repr(sorted(vars(ip).items()))
    h.update(cfg.encode())
    h.update(json.dumps(loaded.merged_kwargs.get("images_kwargs", {}), sort_keys=True, default=str).encode())
    h.update(str(loaded.dtype).encode())
    return h.digest()


def video_identity(loaded, identity: bytes) -> bytes:
    """A clip's features also depend on the video processor's config."""
    vp = getattr(loaded.processor, "video_processor", None)
    try:
        cfg = vp.to_json_string() if vp is not None else ""
    except Exception:
        cfg = repr(sorted(vars(vp).items()))
    return blake3.blake3(identity + b"video\0" + cfg.encode()).digest()


def picture_key(digest: str, identity: bytes) -> PictureKey:
    """BLAKE3 over domain tag, the picture's content digest (hex of its original bytes) and the
    encoder identity: no file read, no decode."""
    h = blake3.blake3(KEY_DOMAIN)
    h.update(bytes.fromhex(digest))
    h.update(identity)
    return PictureKey(h.digest())
