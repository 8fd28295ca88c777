"""The engine protocol, declared: what the window, the headless commands and the blocking helpers
may call on an engine. The built-in `Engine` (engine/local/engine.py) and `RemoteEngine`
(engine/remote/engine.py) both satisfy it (tests/engine/protocol/test_engine_protocol.py checks their
signatures); both build on `EngineWorker` (engine/protocol/worker.py). Turns go in, events come
out through listeners, on the engine's own thread."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from .events import Event, Turn
from .settings import EngineSettings
from .turn_stats import TurnStats


@runtime_checkable
class EngineLike(Protocol):
    settings: EngineSettings  # the built-in engine's settings (a remote engine keeps them for Settings)
    last_turn_stats: TurnStats | None  # the latest finished turn's stats

    @property
    def running(self) -> bool: ...

    def start(self) -> EngineLike: ...

    def add_listener(self, fn: Callable[[Event], None]) -> None: ...

    def remove_listener(self, fn: Callable[[Event], None]) -> None: ...

    def load_model(self, path: str) -> None:
        """A model folder (built-in) or a model name on the server; answers ModelReady or ModelFailed."""

    def new_turn_id(self) -> int: ...

    def submit(self, turn: Turn) -> int:
        """Queue a turn; events TurnStarted, Token..., TurnDone or TurnFailed follow."""

    def stop(self, turn_id: int | None = None) -> None: ...

    def request_memory_report(self) -> None: ...

    def unload_encoder(self) -> None: ...

    def spill_now(self, conversation_id: str) -> None: ...

    def forget(self, conversation_id: str) -> None: ...

    def update_settings(self, **changes) -> None: ...

    def shutdown(self, timeout: float = 30.0) -> None: ...
