"""The catalog of known-good VLMs, kept as data in resources/model_catalog.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

CATALOG_FILE = Path(__file__).resolve().parents[2] / "resources" / "model_catalog.json"


@dataclass(frozen=True)
class CatalogEntry:
    repo_id: str
    family: str
    params: str  # as the model card publishes it, e.g. "2.21B"
    download_gb: float
    approx: bool
    note: str = ""
    vision_params: int | None = None  # vision tower + projector
    kv_bytes_per_token: int | None = None  # at 16 bits

    @property
    def total_params(self) -> int:
        """The model card's count as a number: "2.21B" -> 2_210_000_000, "256M" -> 256_000_000."""
        scale = {"K": 1e3, "M": 1e6, "B": 1e9}
        text = self.params.strip().upper()
        if not text or text[-1] not in scale:
            raise ValueError(f"{self.repo_id}: parameter count {self.params!r} is not like 2.21B or 256M")
        return int(round(float(text[:-1]) * scale[text[-1]]))


def load_catalog(path: Path = CATALOG_FILE) -> list[CatalogEntry]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return [
        CatalogEntry(
            m["repo_id"],
            m["family"],
            m["params"],
            float(m["download_gb"]),
            bool(m.get("approx")),
            m.get("note", ""),
            m.get("vision_params"),
            m.get("kv_bytes_per_token"),
        )
        for m in data["models"]
    ]
