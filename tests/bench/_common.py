"""Shared bits for the benchmarks (run as scripts: `python tests/bench/NAME.py`)."""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def workdir(name: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"parley-bench-{name}-"))


def ratio_line(label: str, value: float, goal: str) -> str:
    return f"{label}: {value:.3f}  (goal {goal})"


def build_big_tower_model(folder: Path) -> Path:
    """LLaVA with an ~86M-parameter CLIP tower (224 px, 256 picture tokens) and a small
    6-layer language model: loading and running the encoder is clearly visible."""
    from tests.fixtures.tiny_models import build_tiny_model

    return build_tiny_model(
        "llava", folder, image_size=224, patch_size=14,
        vision={"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12},
        text={"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 6,
              "num_attention_heads": 8, "num_key_value_heads": 4},
    )
