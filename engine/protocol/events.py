"""What goes into the engine (requests) and what comes out (events): plain dataclasses.

The UI and the headless commands only ever see these; nothing here touches torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from .turn_stats import TurnStats

from ..pictures.ref import PictureRef


# Conversations the engine opens for stateless clients (the API) are named "api:N".
STATELESS_PREFIX = "api:"

# ---------------------------------------------------------------- requests

@dataclass
class Message:
    role: str  # "system" | "user" | "assistant"
    text: str
    images: list[PictureRef] = field(default_factory=list)  # user messages' pictures, hashed where they came in

    def __post_init__(self):
        for p in self.images:  # a bare path here would make the engine hash it every turn
            if not isinstance(p, PictureRef):
                raise TypeError(f"Message.images holds PictureRef, not {type(p).__name__} "
                                "(hash a typed path once with PictureRef.of_file)")


@dataclass
class Sampling:
    greedy: bool = True
    temperature: float = 0.7
    top_p: float = 0.9
    max_new_tokens: int = 256
    seed: int | None = None


@dataclass
class Turn:
    conversation_id: str
    messages: list[Message]  # the whole conversation so far, ending with the new user message
    sampling: Sampling = field(default_factory=Sampling)
    system_prompt: str | None = None
    turn_id: int = 0  # set by Engine.submit


# ---------------------------------------------------------------- events

@dataclass
class Event:
    pass


@dataclass
class ModelLoading(Event):
    path: str


@dataclass
class ModelReady(Event):
    path: str
    family: str
    device: str
    dtype: str
    name: str


@dataclass
class ModelFailed(Event):
    path: str
    message: str


@dataclass
class TurnStarted(Event):
    turn_id: int
    conversation_id: str


@dataclass
class Token(Event):
    turn_id: int
    conversation_id: str
    text: str  # newly decoded text (may be "" while a multi-byte character is incomplete)
    token_id: int


@dataclass
class TurnDone(Event):
    turn_id: int
    conversation_id: str
    reply: str
    token_ids: list[int]
    stats: TurnStats  # LocalTurnStats or RemoteTurnStats (engine/protocol/turn_stats.py)
    stopped: bool = False  # True when the user stopped the reply early


@dataclass
class TurnFailed(Event):
    turn_id: int
    conversation_id: str
    message: str
    partial: str = ""  # reply text that arrived before the failure (a dropped stream): kept, interrupted


@dataclass
class MemoryReport(Event):
    """Exact bytes per component, for the VRAM panel."""
    device: str
    device_name: str
    total_bytes: int
    free_bytes: int
    components: dict[str, int]  # e.g. {"language_model": .., "vision_encoder": ..}
    sessions_kv: dict[str, int]  # conversation id -> hot KV bytes
    counters: dict[str, int | float] = field(default_factory=dict)
    encoder_state: str = "resident"  # resident | unloaded | loading
    encoder_idle_left_s: float | None = None
    store_status: str = ""  # why the SSD store is not in use (e.g. "paused: the disk ... is full"); "" when it is


@dataclass
class EncoderState(Event):
    state: str  # resident | unloaded | loading
    idle_left_s: float | None = None


@dataclass
class SpillState(Event):
    conversation_id: str
    state: str  # spilling | spilled | restored | refused | failed
    detail: str = ""


@dataclass
class Notice(Event):
    """A warning the user should see (cache not writable, disk full, ...)."""
    level: str  # info | warning | error
    message: str


@dataclass
class ServerReport(Event):
    """The memory dock's view of a remote engine: the server owns memory and caches there."""
    server: str  # scheme://host:port
    model: str
    state: str  # connecting | ready | failed
    ttft_s: float | None = None  # last turn: request sent -> first reply text
    tokens_per_s: float | None = None  # last turn, after the first token
    cached_share: float | None = None  # last turn: cached prompt tokens / prompt tokens (None: not reported)
    prompt_tokens: int = 0
    turns: int = 0
    last_error: str = ""
