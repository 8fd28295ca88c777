"""Device and dtype choice (CUDA, Apple MPS, CPU) and the memory dock's numbers on each.

No Mac or GPU is here: torch's device functions are patched to answer as one would, and the
MPS paths that can run here (a model that cannot be placed on the GPU) run for real.
"""

from __future__ import annotations

import dataclasses
from collections import namedtuple

import pytest
import torch
import torch._dynamo  # noqa: F401  imported before the patches: it inspects torch.cuda.is_available once

from engine.device import choice as devices
from engine.device.ledger import build_report, device_totals
from engine.model.load import ModelLoadError, load_model
from engine.protocol.events import Message
from engine.vision.residency import EncoderResidency
from tests.helpers.engine_helpers import ask, open_engine
from tests.helpers.window import make_window  # noqa: F401  (fixture)

GiB = 1 << 30
pytestmark = pytest.mark.slow


@pytest.fixture
def mac(monkeypatch):
    """torch as on an Apple-silicon Mac: no CUDA, MPS available, float16 runs there."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(devices, "dtype_runs_on", lambda device, dtype: None)
    return monkeypatch


def test_a_mac_runs_models_on_mps_in_float16(mac):
    assert devices.choose() == devices.Placement(torch.device("mps"), torch.float16, None)
    assert devices.choose("auto", "bfloat16") == devices.Placement(torch.device("mps"), torch.bfloat16, None)


def test_an_mps_gpu_without_float16_falls_back_to_float32_and_says_why(mac):
    mac.setattr(
        devices, "dtype_runs_on", lambda device, dtype: None if dtype is torch.float32 else "MPS does not support Half"
    )
    place = devices.choose()
    assert (place.device, place.dtype) == (torch.device("mps"), torch.float32)
    assert place.note == (
        "This Mac's GPU cannot run float16 (MPS does not support Half): the model runs "
        "in float32, which takes twice the memory."
    )


def test_cuda_prefers_bfloat16_and_uses_float16_on_older_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert devices.choose() == devices.Placement(torch.device("cuda"), torch.bfloat16, None)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    place = devices.choose()
    assert place.dtype is torch.float16 and "no bfloat16" in place.note


def test_the_cpu_runs_float32(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert devices.choose() == devices.Placement(torch.device("cpu"), torch.float32, None)


def test_an_unusable_device_request_gets_one_sentence(tiny_model, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    folder = tiny_model("llava")
    with pytest.raises(ModelLoadError, match="MPS.*not available here: it needs a Mac with Apple silicon"):
        load_model(folder, device="mps")
    with pytest.raises(ModelLoadError, match="CUDA was asked for"):
        load_model(folder, device="cuda")
    with pytest.raises(ModelLoadError, match="Unknown device 'gpu'"):
        load_model(folder, device="gpu")
    with pytest.raises(ModelLoadError, match="unknown dtype 'half'"):
        load_model(folder, dtype="half")


def test_a_model_the_mac_gpu_cannot_take_runs_on_the_cpu_with_a_notice(mac, tiny_model, tmp_path):
    """This torch has no MPS backend, so placing the model there fails for real: the engine loads
    it on the CPU in float32 from the files and says so; replies equal a plain CPU load's."""
    folder = tiny_model("llava")
    notices: list[str] = []
    engine = open_engine(folder, tmp_path / "a", notices)
    try:
        assert (engine.loaded.device, engine.loaded.dtype) == (torch.device("cpu"), torch.float32)
        assert any(n.startswith("The model could not be placed on the Apple GPU") for n in notices), notices
        got = ask(engine, "c", [Message("user", "what colour is it?")])
    finally:
        engine.shutdown()
    mac.undo()
    plain = open_engine(folder, tmp_path / "b")
    try:
        want = ask(plain, "c", [Message("user", "what colour is it?")])
    finally:
        plain.shutdown()
    assert got.token_ids == want.token_ids and len(got.token_ids) == 8


# ---------------------------------------------------------------- memory on MPS

VM = namedtuple("VM", "total available")


@pytest.fixture
def mps_memory(monkeypatch):
    monkeypatch.setattr(torch.mps, "recommended_max_memory", lambda: 24 * GiB)
    monkeypatch.setattr(torch.mps, "current_allocated_memory", lambda: 5 * GiB)
    monkeypatch.setattr(devices.psutil, "virtual_memory", lambda: VM(32 * GiB, 30 * GiB))
    return monkeypatch


def test_mps_memory_is_the_gpu_working_set_less_what_torch_holds(mps_memory):
    assert device_totals(torch.device("mps")) == ("Apple GPU (unified memory)", 24 * GiB, 19 * GiB)
    # memory is shared with the system: never more free than the system has
    mps_memory.setattr(devices.psutil, "virtual_memory", lambda: VM(32 * GiB, 3 * GiB))
    assert device_totals(torch.device("mps"))[2] == 3 * GiB


def test_the_dock_shows_mps_numbers(mps_memory, tiny_model, make_window, qtbot):
    loaded = dataclasses.replace(load_model(tiny_model("llava")), device=torch.device("mps"))
    report = build_report(loaded, {})
    assert (report.device, report.device_name, report.total_bytes, report.free_bytes) == (
        "mps",
        "Apple GPU (unified memory)",
        24 * GiB,
        19 * GiB,
    )
    w = make_window(load=False)
    w.bridge.inject(report)
    qtbot.waitUntil(lambda: w.memory_dock.device.text() == "Apple GPU (unified memory)", timeout=5000)
    assert w.memory_dock.totals.text() == "Total 24.0 GiB · free 19.0 GiB · used 5.0 GiB"
    assert w.memory_dock.bar.total == 24 * GiB


def test_unloading_the_encoder_on_mps_empties_the_mps_cache(tiny_model, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.mps, "empty_cache", lambda: calls.append("mps"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("cuda"))
    loaded = dataclasses.replace(load_model(tiny_model("llava")), device=torch.device("mps"))
    residency = EncoderResidency(loaded, elastic=True, idle_s=1.0)
    assert residency.unload()
    assert calls == ["mps"]
