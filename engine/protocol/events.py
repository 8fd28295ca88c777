"""What goes into the engine (requests) and what comes out (events): plain dataclasses.

The UI and the headless commands only ever see these; nothing here touches torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from ..pictures.ref import PictureRef
from .turn_stats import TurnStats

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
                raise TypeError(
                    f"Message.images holds PictureRef, not {type(p).__name__} "
                    "(hash a typed path once with PictureRef.of_file)"
                )


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
    # what the window sizes a PDF's default pages by; None when unknown (a remote engine)
    context_tokens: int | None = None  # the model's context length
    page_tokens: int | None = None  # about what one page costs at the render dpi (engine/vision/pictures.py)
    weights: str = ""  # the language model's weight format as loaded (bf16 | fp32 | int8 | ...); "" remote


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
    # where the turn's pictures' features are now, by digest, as PictureMarks says it: sent with
    # the turn's end so a window needs no second request; empty where the engine cannot say
    # (a remote engine: the server keeps its caches to itself)
    pictures: dict[str, PicturePlace] = field(default_factory=dict)


@dataclass
class TurnFailed(Event):
    turn_id: int
    conversation_id: str
    message: str
    partial: str = ""  # reply text that arrived before the failure (a dropped stream): kept, interrupted


class EncoderStatus(StrEnum):
    RESIDENT = "resident"
    UNLOADED = "unloaded"
    LOADING = "loading"


class SpillStatus(StrEnum):
    SPILLING = "spilling"
    SPILLED = "spilled"
    CANCELLED = "cancelled"  # its conversation continued while it was being copied: it stays hot
    REFUSED = "refused"  # the store cannot take it (no store, a cache layout it cannot spill exactly)
    FAILED = "failed"  # the spill failed (disk full, ...): it stays hot


@dataclass
class StoreCounters:
    """The SSD KV store's counters (engine/kvstore/index.py), shown by the Memory dock."""

    spills: int = 0
    spill_failures: int = 0
    blocks_written: int = 0
    tails_written: int = 0  # partial last blocks
    reused_blobs: int = 0
    reused_bytes: int = 0
    missing_blobs: int = 0
    bytes_written: int = 0
    restores: int = 0
    restored_tokens: int = 0
    restore_bytes: int = 0
    bad_blobs: int = 0
    evicted_sessions: int = 0
    bytes_on_disk: int = 0
    blobs_on_disk: int = 0
    sessions: int = 0
    held_bytes: int = 0  # of bytes_on_disk: blobs no session names, deleted when the read holding them ends
    host_buffer_bytes: int = 0


@dataclass
class MemoryReport(Event):
    """Exact bytes per component, for the Memory dock."""

    device: str
    device_name: str
    total_bytes: int
    free_bytes: int
    components: dict[str, int]  # e.g. {"language_model": .., "vision_encoder": ..}
    sessions_kv: dict[str, int]  # conversation id -> hot KV bytes
    counters: dict[str, int | float] = field(default_factory=dict)  # the image gate's
    encoder_state: EncoderStatus = EncoderStatus.RESIDENT
    encoder_idle_left_s: float | None = None
    store: StoreCounters | None = None  # None: the SSD store is not in use
    store_status: str = ""  # why the SSD store is not in use (e.g. "paused: the disk ... is full"); "" when it is


@dataclass
class EncoderState(Event):
    state: EncoderStatus
    idle_left_s: float | None = None


@dataclass
class SpillState(Event):
    conversation_id: str
    state: SpillStatus
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


# ---------------------------------------------------------------- where each chat's memory is


class KVPlace(StrEnum):
    """Where a conversation's KV cache is, as the sidebar marks it."""

    HOT = "hot"  # in memory: its next turn starts at once
    SPILLING = "spilling"  # being written to the SSD store; still in memory meanwhile
    ON_SSD = "on_ssd"  # in the SSD store only: read back before (or at) its next turn
    RESTORING = "restoring"  # being read back from the SSD store
    NOT_CACHED = "not_cached"  # nowhere: its next turn re-reads (prefills) the whole conversation


@dataclass
class MeasuredRates:
    """Running averages measured on this machine (kept across restarts in the data folder);
    None until the first measurement."""

    restore_mib_s: float | None = None  # KV read back from the SSD store, verified, in memory
    prefill_tok_s: float | None = None  # prompt tokens the loaded model reads per second

    def restore_s(self, nbytes: int) -> float | None:
        return nbytes / (self.restore_mib_s * (1 << 20)) if self.restore_mib_s else None

    def prefill_s(self, tokens: int) -> float | None:
        return tokens / self.prefill_tok_s if self.prefill_tok_s else None


@dataclass
class ChatMemory:
    conversation_id: str
    place: KVPlace
    tokens: int = 0  # tokens its KV holds (in memory, or in the store when on the SSD)
    kv_bytes: int = 0  # bytes of that KV (in memory, or on the SSD)
    resume_s: float | None = None  # on the SSD: estimated restore time at the measured rate
    reread_s: float | None = None  # estimated time to re-read the same tokens (measured prefill rate)
    restored_tokens: int = 0  # restoring: tokens read back so far
    held_back: str = ""  # on the SSD and not restored ahead of its turn: why (memory is short, ...)


@dataclass
class ChatMemoryReport(Event):
    """Every conversation whose KV is somewhere (memory or the SSD store of the loaded model); a
    conversation not listed has none (not cached). Sent whenever one of them changes place."""

    chats: list[ChatMemory]
    rates: MeasuredRates = field(default_factory=MeasuredRates)

    def of(self, conversation_id: str) -> ChatMemory:
        for c in self.chats:
            if c.conversation_id == conversation_id:
                return c
        return ChatMemory(conversation_id, KVPlace.NOT_CACHED)


class PicturePlace(StrEnum):
    """Where a picture's encoded features are."""

    RAM = "ram"  # cached in memory: no encoder, no file read
    DISK = "disk"  # cached on disk: no encoder
    NOT_CACHED = "not_cached"  # the vision encoder will read it on its next turn


@dataclass
class PictureMarks(Event):
    places: dict[str, PicturePlace]  # picture digest (PictureRef.digest) -> where its features are
