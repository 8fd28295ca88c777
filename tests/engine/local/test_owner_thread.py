"""The model-owner thread never dies without a word: a SystemExit raised inside a request (as a
stray module shadowing an optional package raised it during a load) fails that request with
one line and the engine keeps working; if the thread does end, every request waiting on it, and
every later one, is answered at once instead of waiting forever."""

from __future__ import annotations

import sys

import pytest

from engine.local.engine import Engine
from engine.protocol.client import EngineError, load_blocking, run_blocking
from engine.protocol.events import Message, ModelLoading, Sampling, Turn, TurnDone, TurnFailed
from engine.protocol.settings import EngineSettings


def exits_on(kind):
    def listener(ev):
        if isinstance(ev, kind):
            sys.exit(3)  # what `import kernels` did when a stray kernels.py called sys.exit

    return listener


def test_a_system_exit_inside_a_load_fails_the_load_and_the_engine_lives(tiny_model, tmp_path):
    engine = Engine(EngineSettings(), tmp_path / "data").start()
    try:
        hostile = exits_on(ModelLoading)
        engine.add_listener(hostile)
        with pytest.raises(EngineError) as exc:
            load_blocking(engine, str(tiny_model("llava")), timeout=60)
        assert "SystemExit" in str(exc.value) and "\n" not in str(exc.value)
        assert engine.running
        engine.remove_listener(hostile)
        load_blocking(engine, str(tiny_model("llava")), timeout=120)  # the same engine loads it now
        r = run_blocking(engine, Turn("c", [Message("user", "hi")], Sampling(max_new_tokens=2)), timeout=120)
        assert isinstance(r, TurnDone) and len(r.token_ids) == 2
    finally:
        engine.shutdown()


def test_a_dead_owner_thread_answers_every_waiting_and_later_request(tiny_model, tmp_path):
    engine = Engine(EngineSettings(), tmp_path / "data").start()
    try:
        always = exits_on(object)  # even the failure it is told of: the thread itself ends
        engine.add_listener(always)
        with pytest.raises(EngineError) as exc:
            load_blocking(engine, str(tiny_model("llava")), timeout=60)
        assert "SystemExit" in str(exc.value)
        engine._thread.join(30)
        assert not engine.running
        engine.remove_listener(always)
        r = run_blocking(engine, Turn("c", [Message("user", "hi")], Sampling(max_new_tokens=2)), timeout=5)
        assert isinstance(r, TurnFailed) and "engine stopped" in r.message
        with pytest.raises(EngineError, match="engine stopped"):
            load_blocking(engine, str(tiny_model("llava")), timeout=5)
    finally:
        engine.shutdown()
