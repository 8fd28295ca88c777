"""Engine settings: one dataclass, filled from the UI's settings or a replay script."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

# language-model weight formats (engine/model/weights.py): here so the window and CLI list them without torch
WEIGHT_FORMATS = ("auto", "bf16", "fp16", "fp32", "int8", "int4", "4bit")


@dataclass
class EngineSettings:
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    weights: str = (
        "auto"  # language-model weights: auto | bf16 | fp16 | fp32 | int8 | int4 | 4bit (engine/model/weights.py)
    )
    memory_budget_bytes: int | None = None  # cap on model + KV memory; None: the device's free memory
    prefill_chunk_tokens: int = 2048  # long prompts prefill in pieces: bounded attention memory
    lookup_decoding: bool = True  # greedy turns draft repeated text from the conversation (exact)
    # image-cache gate
    elastic: bool = True
    elastic_idle_s: float = 60.0
    image_cache_entries: int = 64
    image_cache_ram_bytes: int = 1 << 30
    image_cache_disk_bytes: int = 2 << 30
    # session spill
    spill_idle_s: float = 120.0
    block_tokens: int = 256
    unit_bytes: int = 32 << 20
    store_cap_bytes: int | None = None  # None: the KV store's default_cap (kvstore/store.py)

    def with_changes(self, changes: dict[str, Any]) -> EngineSettings:
        """A copy with `changes` applied; unknown names are a clear error, not a silent no-op."""
        known = {f.name: f.type for f in fields(self)}
        unknown = sorted(set(changes) - set(known))
        if unknown:
            raise ValueError(f"unknown engine setting(s): {', '.join(unknown)}")
        if "weights" in changes and changes["weights"] not in WEIGHT_FORMATS:
            raise ValueError(f"unknown weights format {changes['weights']!r} (use {', '.join(WEIGHT_FORMATS)})")
        return replace(self, **changes)

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}
