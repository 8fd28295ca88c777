"""Before a download: which files a model needs, and whether Parley can load it at all.

Both answers come from the repo's file list and a few small JSON files, never the weights.
"""

from __future__ import annotations

import json
from fnmatch import fnmatch

from ..model.families import unsupported

# Top-level files a VLM needs: weights, configs, tokenizer, processor, chat template.
NEEDED = ("*.safetensors", "*.safetensors.index.json", "*.json", "*.jinja", "tokenizer.model", "*.txt", "*.tiktoken")
# Other weight formats and exports are never fetched: Parley loads safetensors only.
NOT_NEEDED = (
    "*.bin",
    "*.gguf",
    "*.pth",
    "*.pt",
    "*.h5",
    "*.msgpack",
    "*.ot",
    "*.onnx",
    "*.onnx_data",
    "README*",
    "LICENSE*",
    "*.md",
)
INDEX = "model.safetensors.index.json"
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
TEMPLATE_CARRIERS = ("processor_config.json", "tokenizer_config.json")


def needed_files(names: list[str], index: dict | None = None) -> list[str]:
    """The files to fetch. Sub-folders (onnx/, other variants) are skipped; with a shard index only
    the shards it names are fetched (some repos also ship a consolidated copy of the weights)."""
    picked = [
        n
        for n in names
        if "/" not in n and any(fnmatch(n, p) for p in NEEDED) and not any(fnmatch(n, p) for p in NOT_NEEDED)
    ]
    if index is not None:
        shards = set((index.get("weight_map") or {}).values())
        picked = [n for n in picked if not n.endswith(".safetensors") or n in shards]
    return picked


def template_source(names: list[str]) -> str | None:
    """The file that may hold the chat template, or None when a dedicated template file exists."""
    if any(n in names for n in CHAT_TEMPLATE_FILES):
        return None
    for carrier in TEMPLATE_CARRIERS:
        if carrier in names:
            return carrier
    return ""


def problem(config: dict | None, names: list[str], carrier_json: dict | None = None) -> str | None:
    """Why Parley could not load this repo once downloaded (None: it passes).

    `carrier_json` is the content of `template_source(names)` when that is a JSON file."""
    if config is None:
        return "no config.json, so it is not a transformers model"
    why = unsupported(config)
    if why:
        return why
    if not any(n.endswith(".safetensors") and "/" not in n for n in names):
        return "no .safetensors weights (Parley loads safetensors only)"
    source = template_source(names)
    if source is None:
        return None
    if not source or not (carrier_json or {}).get("chat_template"):
        return "no chat template, so Parley cannot format a conversation for it"
    return None


def read_json(path) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
