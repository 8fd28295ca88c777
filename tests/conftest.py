"""Shared pytest fixtures: tiny model folders built once per test session."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# PARLEY_SIMULATE_PLATFORM=windows|macos: run as that OS would (tests/helpers/platform_sim.py); before
# any engine module is imported
from tests.helpers.platform_sim import MISSING, from_environment  # noqa: E402

SIMULATED_PLATFORM = from_environment()


def pytest_report_header(config):
    if SIMULATED_PLATFORM:
        return f"parley platform simulation: {SIMULATED_PLATFORM} (absent: {', '.join(MISSING[SIMULATED_PLATFORM])})"
    return "parley platform simulation: off"


@pytest.fixture(autouse=True)
def _qt_garbage_collected_on_the_main_thread(request):
    """Widgets a window test leaves in reference cycles are collected here, on the main thread.
    Left for later, a collection may run on a worker thread (a Models page fit, an engine thread):
    shiboken then hands their deletion to the main thread, where it crashed in
    BindingManager::runDeletionInMainThread during test_models_page after the window tests."""
    yield
    if "qtbot" in request.fixturenames:
        gc.collect()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """Factory: tiny_model(family) -> folder of a seeded tiny VLM, built once per session."""
    from engine.model.heavy_imports import heavy
    from tests.fixtures.tiny_models import build_tiny_model

    heavy()  # an engine thread started by a test may be importing transformers right now
    built: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in built:
            built[family] = build_tiny_model(family, tmp_path_factory.mktemp(f"model-{family}"))
        return built[family]

    return get


def _tiny_model_families():
    from tests.fixtures.tiny_models import FAMILIES

    return FAMILIES


@pytest.fixture(scope="session", params=_tiny_model_families())
def tiny_model_dir(request, tiny_model):
    """A tiny model folder; a test using it runs once per family in FAMILIES
    (the family is in the folder's ``parley_tiny_model.json``)."""
    return tiny_model(request.param)


@pytest.fixture
def small_disk(tmp_path):
    """A real 8 MiB tmpfs under tmp_path (skips where mounting is not allowed)."""
    from tests.fixtures.full_disk import mount_small_disk, unmount

    disk = mount_small_disk(tmp_path / "small-disk")
    if disk is None:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield disk
    unmount(disk)
