"""What a finished turn measured: TurnDone.stats.

TurnStats is what every engine reports; the local engine (LocalTurnStats) and a remote server
(RemoteTurnStats) each add what only they know. The engine fills each field once, when the turn
ends. as_dict() is the JSON form headless replay prints, one key per field.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TurnStats:
    """A turn stopped before it began reports this, all zero."""

    prompt_tokens: int = 0  # the whole prompt the model saw, the cached opening included
    generated_tokens: int = 0  # reply tokens
    first_token_s: float = 0.0  # turn start -> first reply token: restore, encode and prefill, or the server's wait
    decode_s: float = 0.0  # first reply token -> last
    tokens_per_s: float = 0.0  # reply decode speed

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(kw_only=True)
class LocalTurnStats(TurnStats):
    # the prompt: its opening already hot in RAM, read back from the SSD store, or prefilled now
    reused_tokens: int
    restored_tokens: int
    prefill_tokens: int
    max_new_tokens: int  # the reply limit after the cut to the model's context, if any
    prefill_s: float
    restore_s: float  # spent in this turn reading KV back from the SSD store
    restore_ahead_s: float  # spent before it: the restore that began when the chat was opened
    # what re-reading the opening it did not prefill (reused + restored) would have taken at the
    # prefill rate measured on this machine; None until a rate was measured
    reread_estimate_s: float | None
    # prompt-lookup decoding: draft tokens sent for verification, kept, and the kept share
    draft_tokens: int
    draft_accepted: int
    draft_acceptance: float
    # the picture gate: encoder time and loads, picture-cache hits (RAM or disk) and misses
    encode_s: float
    encoder_loads: int
    encoder_load_s: float
    encoder_resident: bool  # the vision encoder is still in memory after the turn
    image_cache_hits: int
    image_cache_ram_hits: int
    image_cache_disk_hits: int
    image_cache_misses: int
    pictures_encoded: int
    # this conversation's latest SSD spill, committed since its previous turn
    spill_blocks_written: int
    spill_blocks_reused: int
    weights: str  # the language model's weight format: "fp32", "int8", "4bit", ...
    weight_bytes: int


@dataclass(kw_only=True)
class RemoteTurnStats(TurnStats):
    engine: str = "remote"
    server: str  # the server's base URL
    model: str  # the model name the server was asked for
    cached_tokens: int  # prompt tokens the server said it had cached (0 when it did not say)
    usage_reported: bool  # the server sent token usage (else generated_tokens counts text pieces)
    cached_reported: bool  # it said how many prompt tokens were cached
    ttft_s: float  # request sent -> first reply text
    total_s: float  # request sent -> reply over
    finish_reason: str
    streamed: bool
    queue_s: float  # submit -> request sent: waiting for the worker thread and turns ahead
    # what another Parley's picture gate did for this turn (its usage "parley" numbers)
    server_gate: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update({f"server_{k}": v for k, v in out.pop("server_gate").items()})
        return out
