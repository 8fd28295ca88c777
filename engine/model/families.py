"""The model families Parley runs, described once: every other place (loading, weight formats,
the encoder's residency, the pre-download check, the fit estimate, the error a user reads)
reads this table. Torch-free, so the window and the model library can ask it without waiting
for torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Family:
    name: str  # config.json's model_type
    label: str  # how a person calls it
    # attribute paths (under the top-level model) of the modules that form the vision encoder
    vision_modules: tuple[str, ...]
    nested_images: bool = False  # the image processor wants [[img]] (one list per sample)
    mrope: bool = False  # Qwen2-VL style 3-D positions from get_rope_index
    native_video: bool = False  # takes a clip's frames as one video through its processor's video path
    # what the fit estimate counts (engine/library/fit.py): the vision tower's patch embedding
    # and MLP, and the connector from picture features to the language model
    vision_patch: Literal["conv2d", "conv3d"] = "conv2d"  # conv3d: temporal patches, rotary positions
    vision_mlp: Literal["plain", "gated"] = "plain"  # plain: fc1, fc2, LayerNorms; gated: gate, up, down, RMSNorms
    connector: Literal["mlp2", "pixel_shuffle", "merger"] = "mlp2"  # two linears | one linear | norm + two linears


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("llava", "LLaVA", ("model.vision_tower", "model.multi_modal_projector")),
        Family(
            "qwen2_vl",
            "Qwen2-VL",
            ("model.visual",),
            mrope=True,
            native_video=True,
            vision_patch="conv3d",
            connector="merger",
        ),
        Family(
            "qwen2_5_vl",
            "Qwen2.5-VL",
            ("model.visual",),
            mrope=True,
            native_video=True,
            vision_patch="conv3d",
            vision_mlp="gated",
            connector="merger",
        ),
        Family(
            "idefics3",
            "Idefics3",
            ("model.vision_model", "model.connector"),
            nested_images=True,
            connector="pixel_shuffle",
        ),
        Family(
            "smolvlm",
            "SmolVLM",
            ("model.vision_model", "model.connector"),
            nested_images=True,
            connector="pixel_shuffle",
        ),
    )
}

# text model types (a family's text_config) whose attention projections q, k, v carry biases
QKV_BIAS_TEXT_TYPES = frozenset({"qwen2", "qwen2_vl_text", "qwen2_5_vl_text"})


def supported_labels() -> str:
    """'LLaVA, Qwen2-VL, Qwen2.5-VL, Idefics3 and SmolVLM'."""
    labels = [f.label for f in FAMILIES.values()]
    return ", ".join(labels[:-1]) + " and " + labels[-1]


def unsupported(config: dict) -> str | None:
    """Why a config.json names no family Parley runs (None: it names one)."""
    model_type = config.get("model_type")
    if model_type in FAMILIES:
        return None
    archs = ", ".join(config.get("architectures") or []) or "unknown"
    return f"unsupported architecture {model_type!r} ({archs}); Parley supports {supported_labels()}"
