"""Blocking helpers over an engine's events (either engine: EngineLike), for headless commands
and tests."""

from __future__ import annotations

import threading

from .engine_like import EngineLike
from .events import ModelFailed, ModelReady, Token, Turn, TurnDone, TurnFailed


class EngineError(RuntimeError):
    pass


class Interrupted(KeyboardInterrupt):
    """Ctrl+C while a turn ran: the turn was asked to stop; `partial` is the text it had streamed."""

    def __init__(self, partial: str):
        super().__init__()
        self.partial = partial


def load_blocking(engine: EngineLike, path: str, timeout: float = 600.0) -> ModelReady:
    done = threading.Event()
    box: dict = {}

    def listen(ev):
        if isinstance(ev, (ModelReady, ModelFailed)) and "ev" not in box:
            box["ev"] = ev
            done.set()

    engine.add_listener(listen)
    try:
        engine.load_model(path)
        if not done.wait(timeout):
            raise EngineError(f"loading {path} took longer than {timeout:.0f} s")
    finally:
        engine.remove_listener(listen)
    if isinstance(box["ev"], ModelFailed):
        raise EngineError(box["ev"].message)
    return box["ev"]


def run_blocking(engine: EngineLike, turn: Turn, on_token=None, timeout: float = 3600.0) -> TurnDone | TurnFailed:
    """Submit a turn and wait for its TurnDone / TurnFailed. Ctrl+C stops the turn and raises
    Interrupted with the text streamed so far."""
    done = threading.Event()
    box: dict = {}
    wanted: dict = {}
    parts: list[str] = []

    def listen(ev):
        tid = getattr(ev, "turn_id", None)
        if tid is None or tid != wanted.get("id"):
            return
        if isinstance(ev, Token):
            parts.append(ev.text)
            if on_token is not None:
                on_token(ev)
        elif isinstance(ev, (TurnDone, TurnFailed)):
            box["ev"] = ev
            done.set()

    engine.add_listener(listen)
    try:
        # take the id before queueing so no event of this turn can slip past the listener
        wanted["id"] = turn.turn_id = engine.new_turn_id()
        engine.submit(turn)
        if not done.wait(timeout):
            engine.stop(turn.turn_id)
            raise EngineError(f"turn did not finish within {timeout:.0f} s")
    except KeyboardInterrupt:
        engine.stop(turn.turn_id)
        raise Interrupted("".join(parts)) from None
    finally:
        engine.remove_listener(listen)
    return box["ev"]
