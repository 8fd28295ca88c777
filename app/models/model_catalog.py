"""Where models come from: the shipped demo, recent folders, and the Hugging Face cache.

Only reads config.json files (no model loading), so listing is instant.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.library.installed import snapshot_for
from engine.platform.paths import DEMO_MODEL, is_demo_model


@dataclass
class ModelEntry:
    path: str
    name: str
    source: str  # demo | recent | cache
    problem: str | None = None  # why it cannot be loaded, if known
    family: str | None = None


def hf_hub_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def read_config(folder: Path) -> dict | None:
    try:
        return json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def is_vision_language(config: dict) -> bool:
    return "vision_config" in config or any(
        k in config for k in ("image_token_index", "image_token_id", "vision_start_token_id")
    )


def scan_hf_cache(hub: Path | None = None, check: Callable[[Path], str | None] | None = None) -> list[ModelEntry]:
    """Vision-language models in the HF hub cache (text-only models are left out)."""
    hub = hub or hf_hub_dir()
    out: list[ModelEntry] = []
    if not hub.is_dir():
        return out
    for repo_dir in sorted(hub.glob("models--*")):
        snap = snapshot_for(repo_dir)
        if snap is None:
            continue
        config = read_config(snap)
        if config is None or not is_vision_language(config):
            continue
        name = repo_dir.name[len("models--") :].replace("--", "/")
        out.append(ModelEntry(str(snap), name, "cache", check(snap) if check else None, config.get("model_type")))
    return out


def demo_entry(check: Callable[[Path], str | None] | None = None) -> ModelEntry:
    if not (DEMO_MODEL / "config.json").is_file():
        return ModelEntry(
            str(DEMO_MODEL),
            "Parley Shapes (demo)",
            "demo",
            "The demo model is not installed yet (resources/models/parley-shapes).",
        )
    config = read_config(DEMO_MODEL) or {}
    return ModelEntry(
        str(DEMO_MODEL), "Parley Shapes (demo)", "demo", check(DEMO_MODEL) if check else None, config.get("model_type")
    )


def recent_entries(paths: list[str], check: Callable[[Path], str | None] | None = None) -> list[ModelEntry]:
    out = []
    for p in paths:
        if is_demo_model(p):  # the Demo group has it
            continue
        config = read_config(Path(p))
        out.append(
            ModelEntry(p, Path(p).name, "recent", check(Path(p)) if check else None, (config or {}).get("model_type"))
        )
    return out
