"""A model the engine lets go of is freed at once -- by reference counting, with the garbage
collector switched off -- on shutdown and on a model switch; on CUDA its memory goes back."""

from __future__ import annotations

import contextlib
import gc
import weakref

import pytest
import torch

from engine.protocol.client import load_blocking
from engine.protocol.events import Message
from tests.fixtures.pictures import make_picture, pics
from tests.helpers.engine_helpers import ask, expect_done, open_engine

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def no_collector():
    """Only reference counting frees anything in here: a cycle keeps what it holds."""
    was = gc.isenabled()
    gc.collect()  # start clean: nothing earlier is waiting for the collector
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def used_engine(model_dir, tmp_path, **settings):
    """An engine after a picture turn: features cached, a session hot, the encoder loaded."""
    engine = open_engine(model_dir, tmp_path / "d", elastic_idle_s=3600, **settings)
    pic = make_picture(tmp_path / "a.png", 1)
    expect_done(ask(engine, "c", [Message("user", "What is this?", pics(pic))], 4))
    assert engine.gate.ram.nbytes > 0 and engine.sessions.kv_bytes() > 0
    return engine


def refs_to(engine) -> list[weakref.ref]:
    loaded = engine.loaded
    vision = next(iter(loaded.vision_parameters()))
    return [weakref.ref(x) for x in (loaded, loaded.model, loaded.processor, engine.gate, vision)]


def test_shutdown_frees_the_model_without_the_collector(tiny_model, tmp_path):
    with no_collector():
        engine = used_engine(tiny_model("llava"), tmp_path)
        refs = refs_to(engine)
        engine_ref = weakref.ref(engine)
        engine.shutdown()
        assert [r() is None for r in refs] == [True] * len(refs)  # the engine itself may live on
        del engine
        assert engine_ref() is None


def test_model_switch_frees_the_old_model_before_the_new_one_serves(tiny_model, tmp_path):
    with no_collector():
        engine = used_engine(tiny_model("llava"), tmp_path)
        try:
            refs = refs_to(engine)
            new_model = str(tiny_model("qwen2_vl"))  # built (if need be) before the hook below
            # whether the old model still lived each time the new one registered a parameter
            old_alive: list[bool] = []
            hook = torch.nn.modules.module.register_module_parameter_registration_hook(
                lambda module, name, param: old_alive.append(refs[1]() is not None)
            )
            try:
                load_blocking(engine, new_model)
            finally:
                hook.remove()
            assert old_alive and not any(old_alive)  # two models never held at once
            assert [r() is None for r in refs] == [True] * len(refs)
            pic = make_picture(tmp_path / "b.png", 2)
            done = expect_done(ask(engine, "c2", [Message("user", "And this?", pics(pic))], 4))
            assert done.stats.pictures_encoded == 1
        finally:
            engine.shutdown()


def test_a_folder_that_is_no_model_keeps_the_loaded_one(tiny_model, tmp_path):
    engine = used_engine(tiny_model("llava"), tmp_path)
    try:
        model = engine.loaded.model
        with pytest.raises(Exception, match="config.json"):
            load_blocking(engine, str(tmp_path))
        assert engine.loaded is not None and engine.loaded.model is model
        expect_done(ask(engine, "c", [Message("user", "still there?")], 2))
    finally:
        engine.shutdown()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_memory_returns_to_its_baseline(tiny_model, tmp_path):
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    with no_collector():
        engine = used_engine(tiny_model("llava"), tmp_path, device="cuda")
        assert torch.cuda.memory_allocated() > baseline
        engine.shutdown()
        del engine
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == baseline
