"""Screenshot of the Models page (real window; run under Xvfb), served by the local hub stand-in:
two catalog models whose config.json carries the published numbers (weights are stand-in bytes),
one download paused mid-way by the stand-in so the progress bar shows, and one installed model.

xvfb-run -a -s "-screen 0 1400x900x24" .venv/bin/python packaging/models_screenshot.py --out docs/screenshots
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="docs/screenshots")
    args = ap.parse_args()
    import pytest
    from PySide6.QtWidgets import QApplication

    from tests.fixtures.hub_standin import safetensors_bytes, start_standin
    from tests.fixtures.tiny_models import build_tiny_model
    from tests.helpers.hub_configs import QWEN2_VL_2B, SMOLVLM_256M

    work = Path(tempfile.mkdtemp(prefix="parley-models-shot-"))
    mp = pytest.MonkeyPatch()
    hub = start_standin(mp, work / "hub")
    template = {"chat_template.jinja": b"{{ messages }}"}
    hub.add_repo(
        "HuggingFaceTB/SmolVLM-256M-Instruct",
        {
            "config.json": json.dumps(SMOLVLM_256M).encode(),
            **template,
            "model.safetensors": safetensors_bytes(48 << 20),
        },
    )
    hub.add_repo(
        "Qwen/Qwen2-VL-2B-Instruct",
        {"config.json": json.dumps(QWEN2_VL_2B).encode(), **template, "model.safetensors": safetensors_bytes(1 << 20)},
    )
    hub.add_folder("acme/tiny-smolvlm", build_tiny_model("smolvlm", work / "tiny"))

    from app.models.models_page import COL_FIT, ModelsPage
    from app.theme import apply_theme
    from engine.library.catalog import load_catalog
    from engine.library.pull import plan_pull, pull

    pull(plan_pull("acme/tiny-smolvlm"))
    existing = QApplication.instance()
    app = existing if isinstance(existing, QApplication) else QApplication(sys.argv)
    apply_theme(app, "light")
    catalog = [e for e in load_catalog() if e.repo_id in hub.repos]
    page = ModelsPage(catalog=catalog)
    page.resize(1100, 520)
    page.show()

    def wait(cond, what):
        import time

        end = time.monotonic() + 120
        while not cond():
            app.processEvents()
            if time.monotonic() > end:
                raise SystemExit(f"timed out waiting for {what}")
            time.sleep(0.02)

    def fit_shown(r: int) -> bool:
        item = page.table.item(r, COL_FIT)
        return item is not None and item.text() not in ("…", "")

    wait(lambda: all(fit_shown(r) for r in range(page.table.rowCount())), "the fit column")
    go_on = threading.Event()
    hub.faults.hold_at["model.safetensors"] = (int(0.42 * (48 << 20)), go_on)
    row = page.row_of("HuggingFaceTB/SmolVLM-256M-Instruct")
    if row is None:
        raise SystemExit("the catalog has no SmolVLM-256M row to download")
    page.table.selectRow(row)
    page.download_selected()
    wait(lambda: page.bar.value() > 300, "the progress bar")
    page.status.setText("Downloading HuggingFaceTB/SmolVLM-256M-Instruct (weights from the local hub stand-in)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    page.grab().save(str(out / "models.png"))
    print(out / "models.png")
    page.cancel_download()
    go_on.set()
    page.wait_idle()
    hub.stop()
    mp.undo()
    return 0


if __name__ == "__main__":
    sys.exit(main())
