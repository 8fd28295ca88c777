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


def load_catalog(path: Path = CATALOG_FILE) -> list[CatalogEntry]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return [CatalogEntry(m["repo_id"], m["family"], m["params"], float(m["download_gb"]), bool(m.get("approx")),
                         m.get("note", "")) for m in data["models"]]
