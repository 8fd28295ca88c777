"""The Models page under pytest-qt against the hub stand-in: search, fit column, progress, cancel."""

from __future__ import annotations

import threading

import pytest

from engine.library.catalog import CatalogEntry
from engine.library.fetch import PART_SUFFIX
from engine.library.hub import repo_folder
from tests.fixtures.hub_standin import safetensors_bytes, start_standin
from tests.helpers.hub_configs import SMOLVLM_256M

BIG = "model.safetensors"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    import json

    h = start_standin(monkeypatch, tmp_path / "hf" / "hub")
    h.add_repo(
        "acme/smol",
        {
            "config.json": json.dumps(SMOLVLM_256M).encode(),
            "chat_template.jinja": b"{{ m }}",
            BIG: safetensors_bytes(4 << 20),
        },
    )
    yield h
    h.stop()


@pytest.fixture
def page(qtbot, hub):
    from app.models.models_page import ModelsPage

    p = ModelsPage(catalog=[CatalogEntry("acme/listed", "llava", "7B", 14.1, True)])
    qtbot.addWidget(p)
    yield p
    p.cancel.set()
    assert p.wait_idle()


def test_search_fit_progress_cancel_resume_load(qtbot, hub, page):
    from app.models.models_page import COL_FIT, COL_INSTALLED

    page.search.setText("acme/smol")
    page.search.returnPressed.emit()
    row = page.row_of("acme/smol")
    assert row is not None and page.selected_repo() == "acme/smol"
    assert page.table.isRowHidden(page.row_of("acme/listed"))  # the filter hides the other row
    fit = page.table.item(row, COL_FIT)
    qtbot.waitUntil(lambda: fit.text() not in ("…", ""), timeout=60_000)
    assert fit.text().startswith(("fits · needs", "tight · needs", "does not fit · needs")) and "free" in fit.text()
    assert "weights" in fit.toolTip() and "vision" in fit.toolTip() and "KV" in fit.toolTip()
    assert page.table.item(page.row_of("acme/listed"), COL_FIT).text() == "unknown"  # 404: no config

    go_on = threading.Event()
    hub.faults.hold_at[BIG] = (1 << 20, go_on)  # the stand-in pauses the big file after 1 MiB
    with qtbot.waitSignal(page.downloadProgress, timeout=30_000, check_params_cb=lambda p: p.file == BIG):
        page.download_selected()
    assert page.bar.value() > 0 and " of 4.0 MiB at " in page.bar_text.text()
    assert page.btn_cancel.isEnabled()
    with qtbot.waitSignal(page.downloadFinished, timeout=30_000):
        page.cancel_download()
        go_on.set()
    assert "paused" in page.status.text()
    part = repo_folder("acme/smol") / "blobs" / (hub.repos["acme/smol"].files[BIG].sha256 + PART_SUFFIX)
    assert 0 < part.stat().st_size < len(hub.repos["acme/smol"].files[BIG].data)

    with qtbot.waitSignal(page.downloadFinished, timeout=60_000):
        page.download_selected()
    assert "is ready" in page.status.text() and page.bar.value() == 1000
    qtbot.waitUntil(lambda: page.btn_load.isEnabled(), timeout=30_000)
    assert page.table.item(row, COL_INSTALLED).text().startswith("✓")
    with qtbot.waitSignal(page.loadRequested) as loaded:
        page.btn_load.click()
    assert loaded.args[0].endswith(hub.repos["acme/smol"].commit)


def test_offline_page_lists_installed_and_says_unreachable_once(qtbot, hub, monkeypatch):
    from app.models.models_page import COL_INSTALLED, ModelsPage
    from engine.library.pull import plan_pull, pull

    pull(plan_pull("acme/smol"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1")
    p = ModelsPage(catalog=[CatalogEntry("acme/listed", "llava", "7B", 14.1, True)])
    qtbot.addWidget(p)
    qtbot.waitUntil(
        lambda: (
            p.row_of("acme/smol") is not None
            and p.table.item(p.row_of("acme/smol"), COL_INSTALLED).text().startswith("✓")
        ),
        timeout=30_000,
    )
    qtbot.waitUntil(lambda: p.status.text().startswith("network unreachable"), timeout=30_000)
    assert p.wait_idle()
    assert p.status.text().count("network unreachable") == 1


def test_recent_folder_is_listed_loadable_and_not_deletable(qtbot, hub, tiny_model):
    import re

    from app.models.models_page import COL_FIT, COL_INSTALLED, COL_PARAMS, ModelsPage

    folder = str(tiny_model("smolvlm"))
    p = ModelsPage(catalog=[], recent=[folder])
    qtbot.addWidget(p)
    r = p.row_of(folder)
    assert p.table.item(r, COL_INSTALLED).text() == "✓ folder"
    qtbot.waitUntil(lambda: p.table.item(r, COL_FIT).text() not in ("…", ""), timeout=60_000)
    assert p.table.item(r, COL_FIT).text().startswith("fits")  # a tiny model fits anywhere
    # a folder has no catalog entry: its parameters are counted from its config.json ("2.63M")
    assert re.fullmatch(r"\d[\d.]*[KMB]", p.table.item(r, COL_PARAMS).text()), p.table.item(r, COL_PARAMS).text()
    p.table.selectRow(r)
    assert p.btn_load.isEnabled() and not p.btn_delete.isEnabled() and not p.btn_download.isEnabled()
    with qtbot.waitSignal(p.loadRequested) as loaded:
        p.btn_load.click()
    assert loaded.args == [folder]
    assert p.wait_idle()


def test_picker_accepts_a_cached_repo_id(qtbot, hub):
    from app.models.model_picker import ModelPicker
    from engine.library.pull import plan_pull, pull

    snap = pull(plan_pull("acme/smol"))
    picker = ModelPicker([], check=lambda _p: None)
    qtbot.addWidget(picker)
    assert picker.try_folder("acme/smol") and picker.chosen == str(snap)


def test_catalog_row_that_parley_cannot_load_says_so_before_download(qtbot, hub):
    from app.models.models_page import COL_INSTALLED, ModelsPage

    hub.add_repo(
        "acme/next",
        {
            "config.json": b'{"model_type": "llava_next", "architectures": ["LlavaNextForConditionalGeneration"]}',
            "chat_template.jinja": b"{{ m }}",
            BIG: safetensors_bytes(1 << 20),
        },
    )
    p = ModelsPage(catalog=[CatalogEntry("acme/next", "llava_next", "7.57B", 15.1, True)])
    qtbot.addWidget(p)
    qtbot.waitUntil(lambda: p.table.item(0, COL_INSTALLED).text() == "cannot be used", timeout=60_000)
    assert p.table.item(0, COL_INSTALLED).toolTip().startswith("unsupported architecture 'llava_next'")
    assert p.table.item(0, 3).text() == "1.0 MiB"  # the live size replaced the catalog's ~14.1 GiB
    assert p.wait_idle()
    p.table.selectRow(0)
    with qtbot.waitSignal(p.downloadFinished, timeout=30_000):
        p.download_selected()
    assert "cannot be used by Parley: unsupported architecture" in p.status.text()
    assert BIG not in hub.sent
    assert p.wait_idle()


def test_a_failed_download_is_said_and_the_buttons_come_back(qtbot, hub, monkeypatch):
    """Issue 27: offline, the fit column's "network unreachable" was said first, so the download's
    own failure (the same words) was dropped and "Checking acme/smol…" stayed; an error no library
    call translates (a damaged cache) ended the worker without any answer."""
    from app.models.models_page import ModelsPage

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1")
    p = ModelsPage(catalog=[CatalogEntry("acme/smol", "smolvlm", "256M", 0.51, True)])
    qtbot.addWidget(p)
    qtbot.waitUntil(lambda: p.status.text().startswith("network unreachable"), timeout=30_000)
    assert p.wait_idle()
    p.table.selectRow(0)
    with qtbot.waitSignal(p.downloadFinished, timeout=30_000):
        p.download_selected()
    assert p.status.text().startswith("acme/smol was not downloaded: network unreachable"), p.status.text()
    assert p.btn_download.isEnabled() and not p.btn_cancel.isEnabled()

    monkeypatch.setenv("HF_ENDPOINT", hub.url)  # the network is back, but the cache is damaged:
    folder = repo_folder("acme/smol")  # a file where the model's folder belongs
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.write_bytes(b"")
    with qtbot.waitSignal(p.downloadFinished, timeout=30_000):
        p.download_selected()
    assert p.status.text().startswith("acme/smol was not downloaded: NotADirectoryError"), p.status.text()
    assert p.btn_download.isEnabled() and p.downloading is None
    assert p.wait_idle()


def test_offline_catalog_rows_are_estimated_from_the_catalog(qtbot, hub, monkeypatch):
    from app.models.models_page import COL_FIT, ModelsPage
    from engine.library.catalog import load_catalog

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1")
    qwen = next(e for e in load_catalog() if e.repo_id == "Qwen/Qwen2-VL-2B-Instruct")
    p = ModelsPage(catalog=[qwen])
    qtbot.addWidget(p)
    fit = p.table.item(0, COL_FIT)
    qtbot.waitUntil(lambda: fit.text() not in ("…", ""), timeout=60_000)
    assert fit.text().startswith(("fits · needs ~", "tight · needs ~", "does not fit · needs ~")), fit.text()
    assert fit.text().endswith(" free")  # "~" says it is an estimate; the tooltip says from what
    assert "estimated from the catalog" in fit.toolTip() and "KV" in fit.toolTip()
    # the catalog's decimal download size, in the one unit the window shows sizes in (app.sizes)
    assert p.table.item(0, 3).text() == f"~{qwen.download_gb * 1e9 / 2**30:.1f} GiB"
    assert "GiB" in fit.text() and " GB" not in fit.text()
    assert p.wait_idle()


def test_speed_column_shows_this_machines_measured_tokens_per_second(qtbot, hub, tiny_model, tmp_path):
    """A model whose shape was measured here shows its record; another model's speeds are scaled
    from it and marked '~'; with nothing measured yet the cell stays empty."""
    import json

    from app.models.models_page import COL_SPEED, ModelsPage
    from engine.model import speed

    folder = tiny_model("smolvlm")
    shape = speed.LayerShape.of_config(json.loads((folder / "config.json").read_text()))
    data = tmp_path / "data"
    speed.write(
        data,
        shape,
        [speed.FormatSpeed("bf16", "bfloat16", 12.5, 300.0, True), speed.FormatSpeed("fp32", "float32", 6.25, 80.0)],
    )
    p = ModelsPage(
        catalog=[CatalogEntry("acme/smol", "idefics3", "256M", 0.5, True)], recent=[str(folder)], data_dir=data
    )
    qtbot.addWidget(p)
    mine, other = p.row_of(str(folder)), p.row_of("acme/smol")
    qtbot.waitUntil(
        lambda: p.table.item(mine, COL_SPEED).text() != "" and p.table.item(other, COL_SPEED).text() != "",
        timeout=60_000,
    )
    assert p.table.item(mine, COL_SPEED).text() == "bf16 12.5, fp32 6.2 tok/s"
    scaled = speed.LayerShape.of_config(SMOLVLM_256M)
    factor = shape.params / scaled.params
    assert p.table.item(other, COL_SPEED).text() == f"~bf16 {12.5 * factor:.1f}, fp32 {6.25 * factor:.1f} tok/s"
    p.cancel.set()
    assert p.wait_idle()
    # nothing measured here: the cell says so (a small model is never measured: it says why)
    empty = ModelsPage(
        catalog=[CatalogEntry("acme/smol", "idefics3", "256M", 0.5, True)],
        recent=[str(folder)],
        data_dir=tmp_path / "nothing-measured",
    )
    qtbot.addWidget(empty)
    assert empty.wait_idle()
    qtbot.waitUntil(lambda: all(empty.table.item(r, COL_SPEED).text() for r in range(2)))  # signals delivered
    cells = {empty.table.item(r, 0).text(): empty.table.item(r, COL_SPEED).text() for r in range(2)}
    assert cells == {str(folder): speed.SMALL_MODEL, "acme/smol": speed.NOT_MEASURED}


def test_every_fit_and_speed_is_whole_at_the_pages_size(qtbot, hub, tiny_model, monkeypatch, tmp_path):
    """Issue 40: the fit column was cut ("… free (estimated fro…"). At the size the page opens,
    every cell but a long model name shows its whole text on one line (offline: the
    catalog's estimates, the longest fit texts; a row without config.json says "—" for its speed)."""
    from PySide6.QtWidgets import QStyle

    from app.models.models_page import COL_FIT, COL_SPEED, UNKNOWN_SPEED, ModelsPage
    from engine.library.catalog import load_catalog

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1")
    p = ModelsPage(catalog=load_catalog(), recent=[str(tiny_model("smolvlm"))], data_dir=tmp_path / "data")
    qtbot.addWidget(p)
    p.show()
    assert p.wait_idle()
    rows = range(p.table.rowCount())
    qtbot.waitUntil(
        lambda: all(p.table.item(r, COL_FIT).text() != "…" and p.table.item(r, COL_SPEED).text() for r in rows)
    )
    table = p.table
    margin = 2 * (table.style().pixelMetric(QStyle.PixelMetric.PM_FocusFrameHMargin, None, table) + 1)
    assert table.horizontalHeader().length() <= table.viewport().width()  # no sideways scrolling
    for r in range(table.rowCount()):
        for c in range(1, table.columnCount()):
            text = table.item(r, c).text()
            assert table.fontMetrics().horizontalAdvance(text) + margin <= table.columnWidth(c), (r, c, text)
    from pathlib import Path

    catalog_rows = [r for r in range(table.rowCount()) if not Path(table.item(r, 0).text()).is_dir()]
    assert len(catalog_rows) == len(load_catalog())
    assert all(table.item(r, COL_SPEED).text() == UNKNOWN_SPEED for r in catalog_rows)
    assert table.item(0, COL_FIT).text().startswith(("fits · needs ~", "tight · needs ~", "does not fit · needs ~"))


def test_fits_are_sized_at_the_precision_parley_runs(qtbot, hub):
    """The precision a fit is sized at is the one Parley runs models in here (float32 on a CPU),
    or the loaded model's, as the window hands it; the tooltip says it."""
    from app.models.models_page import COL_FIT, ModelsPage
    from engine.library.fit import running_precision

    p = ModelsPage(catalog=[])
    qtbot.addWidget(p)
    assert p.precision.currentText() == running_precision()
    if running_precision() == "float32":
        assert p.precision.currentText() == "float32"  # the CPU runs float32, not bfloat16
    q = ModelsPage(catalog=[], precision="int8")
    qtbot.addWidget(q)
    q.search.setText("acme/smol")
    q.search.returnPressed.emit()
    fit = q.table.item(q.row_of("acme/smol"), COL_FIT)
    qtbot.waitUntil(lambda: fit.text() not in ("…", ""), timeout=60_000)
    assert q.precision.currentText() == "int8" and ", int8)" in fit.toolTip()
    assert p.wait_idle() and q.wait_idle()


def test_a_slow_hub_leaves_the_page_responsive_and_the_row_learns_its_size_and_fit(qtbot, hub):
    """Issue 40: the live size was packed into the fit tooltip ("size:N|problem") and parsed back.
    While the Hub holds config.json the page keeps running its timers and shows the catalog's
    estimate; when it answers, the row's facts (RowFacts) and its cells say the live size and fit."""
    from PySide6.QtCore import QTimer

    from app.models.models_page import COL_FIT, COL_INSTALLED, ModelsPage

    go_on = threading.Event()
    hub.faults.hold_at["config.json"] = (10, go_on)
    entry = CatalogEntry("acme/smol", "smolvlm", "256M", 0.51, True, vision_params=93510912, kv_bytes_per_token=23040)
    p = ModelsPage(catalog=[entry])
    qtbot.addWidget(p)
    ticks = []
    timer = QTimer(p)
    timer.timeout.connect(lambda: ticks.append(1))
    timer.start(0)
    fit = p.table.item(0, COL_FIT)
    qtbot.waitUntil(lambda: hub.holding.is_set() and len(ticks) >= 3 and fit.text() != "…", timeout=30_000)
    assert fit.text().startswith(("fits · needs ~", "tight · needs ~", "does not fit · needs ~"))
    assert p.table.item(0, 3).text() == "~486.4 MiB"  # the catalog's 0.51 GB while the Hub is silent
    go_on.set()
    qtbot.waitUntil(lambda: "~" not in fit.text(), timeout=30_000)
    timer.stop()
    facts = p.facts["acme/smol"]
    assert facts.size_bytes == sum(len(f.data) for f in hub.repos["acme/smol"].files.values())
    assert p.table.item(0, 3).text() == "4.0 MiB" and facts.problem is None
    assert fit.text() == facts.fit and fit.toolTip() == facts.fit_tip and "size:" not in fit.toolTip()
    assert p.table.item(0, COL_INSTALLED).text() == ""
    assert p.wait_idle()
