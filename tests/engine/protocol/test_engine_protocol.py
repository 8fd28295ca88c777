"""One declared engine protocol: the built-in Engine and the RemoteEngine both satisfy EngineLike
with the same signatures, so the window and the headless commands can hold either."""

from __future__ import annotations

import inspect

import pytest

from engine.local.engine import Engine
from engine.protocol.engine_like import EngineLike
from engine.remote.engine import RemoteEngine

MEMBERS = [
    name
    for name, value in vars(EngineLike).items()
    if not name.startswith("_") and (callable(value) or isinstance(value, property))
]


def _params(fn) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("cls", [Engine, RemoteEngine])
def test_both_engines_have_every_call_of_the_protocol_with_its_signature(cls):
    assert {"submit", "stop", "load_model", "shutdown", "running"} <= set(MEMBERS)
    for name in MEMBERS:
        declared, given = getattr(EngineLike, name), getattr(cls, name, None)
        assert given is not None, f"{cls.__name__} lacks {name}"
        if isinstance(declared, property):
            assert isinstance(given, property), f"{cls.__name__}.{name} is no property"
            continue
        # the same parameters in the same order and kinds; an engine may give a default the protocol lacks
        assert _params(given) == _params(declared), f"{cls.__name__}.{name}{inspect.signature(given)}"


def test_engines_made_here_are_engine_like(tmp_path):
    from engine.remote.config import RemoteConfig

    local = Engine(data_dir=tmp_path / "d")  # not started: no torch, no thread
    remote = RemoteEngine(RemoteConfig("http://127.0.0.1:9"))
    try:
        assert isinstance(local, EngineLike) and isinstance(remote, EngineLike)
        assert local.last_turn_stats is None and remote.last_turn_stats is None
    finally:
        remote.shutdown()
