"""Running the vision encoder + projector on one picture."""

from __future__ import annotations

import inspect
from typing import Any

import torch

from .entry import PictureEntry


def encoder_inputs(features_fn, processed: dict) -> dict[str, Any]:
    """Keep only the arguments `get_image_features` (a clip: `get_video_features`) accepts
    (rows/cols etc. are prompt-only)."""
    params = inspect.signature(features_fn).parameters
    out = {}
    for k, v in processed.items():
        if k in params and v is not None:
            out[k] = v if isinstance(v, torch.Tensor) else torch.as_tensor(v)
    return out


@torch.inference_mode()
def encode_entry(loaded, entry: PictureEntry) -> torch.Tensor:
    """Post-projector features [n_tokens, hidden] for one prepared picture, kept on CPU."""
    inner = loaded.model.model
    features_fn = inner.get_video_features if entry.modality == "video" else inner.get_image_features
    inputs = encoder_inputs(features_fn, entry.encoder_inputs or {})
    for k, v in inputs.items():
        v = v.to(loaded.device)
        if v.is_floating_point():
            v = v.to(loaded.dtype)
        inputs[k] = v
    out = features_fn(**inputs, return_dict=True)
    pooled = out.pooler_output
    if isinstance(pooled, (list, tuple)):
        feats = torch.cat(list(pooled), dim=0)
    else:
        feats = pooled.reshape(-1, pooled.shape[-1])
    if feats.shape[0] != entry.n_tokens:
        raise RuntimeError(f"encoder gave {feats.shape[0]} feature rows for a picture of {entry.n_tokens} tokens")
    return feats.detach().to("cpu")
