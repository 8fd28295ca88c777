"""Is this folder a model Parley can load? Answered from config.json and the file names alone,
torch-free, so the window's folder check never waits for torch to import."""

from __future__ import annotations

import json
from pathlib import Path

from .families import unsupported


class ModelLoadError(Exception):
    """A folder that cannot be used as a model; the message is meant for the user."""


def check_folder(path: Path) -> dict:
    """Fail early, with a sentence a user understands, on folders that are not a supported VLM;
    returns its config.json."""
    if not path.exists():
        raise ModelLoadError(f"Model folder not found: {path}")
    if not path.is_dir():
        raise ModelLoadError(f"Not a folder: {path} (choose the folder that holds config.json)")
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise ModelLoadError(f"{path} has no config.json, so it is not a transformers model folder")
    try:
        config = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{cfg_path} cannot be read as JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{cfg_path} holds no JSON object, so it is not a transformers model config")
    why = unsupported(config)
    if why:
        raise ModelLoadError(why[0].upper() + why[1:] + ".")
    if not any(path.glob("*.safetensors")):
        raise ModelLoadError(f"{path} has no .safetensors weights (Parley loads safetensors only)")
    return config
