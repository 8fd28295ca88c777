"""What a finished turn did, in one plain line: where its conversation came from (memory, the SSD
store, or read afresh), what its pictures cost, and how fast the reply came. Shown under the reply
and in the Memory dock; the figures are the engine's own (TurnStats), nothing is guessed here.

    Resumed 8,190 tokens from SSD in 0.41 s (re-reading would take ~7 min) · picture from cache,
    encoder stayed off · 42 tok/s
"""

from __future__ import annotations

from engine.protocol.turn_stats import LocalTurnStats, RemoteTurnStats, TurnStats


def duration(seconds: float) -> str:
    """A measured time: "8 ms", "0.41 s", "12 s", "3.2 min"."""
    if seconds < 0.1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 10:
        return f"{seconds:.2f} s" if seconds < 1 else f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def estimate(seconds: float) -> str:
    """An estimate, rounded as one: "~0.4 s", "~12 s", "~7 min", "~2 h"."""
    if seconds < 1:
        return f"~{seconds:.1f} s" if seconds >= 0.05 else "~0 s"
    if seconds < 90:
        return f"~{seconds:.0f} s"
    if seconds < 5400:
        return f"~{seconds / 60:.0f} min"
    return f"~{seconds / 3600:.0f} h"


def _pictures(n: int) -> str:
    return "picture" if n == 1 else f"{n} pictures"


def _prompt_part(s: LocalTurnStats) -> str:
    reread = f" (re-reading would take {estimate(s.reread_estimate_s)})" if s.reread_estimate_s else ""
    if s.restored_tokens:
        took = s.restore_s + s.restore_ahead_s
        ahead = " while the chat was open" if s.restore_ahead_s and not s.restore_s else ""
        return f"Resumed {s.restored_tokens:,} tokens from SSD in {duration(took)}{ahead}{reread}"
    if s.reused_tokens:
        return f"Continued {s.reused_tokens:,} tokens from memory{reread}"
    return f"Read {s.prefill_tokens:,} tokens in {duration(s.prefill_s)}"


def _picture_part(s: LocalTurnStats) -> str:
    hits, misses = s.image_cache_hits, s.image_cache_misses
    if not hits and not misses:
        return ""
    if not misses:
        if s.encoder_loads == 0 and not s.encoder_resident:
            return f"{_pictures(hits)} from cache, encoder stayed off"
        return f"{_pictures(hits)} from cache, encoder not used"
    new = "new picture" if misses == 1 else f"{misses} new pictures"
    part = f"{new} encoded in {duration(s.encode_s)}"
    if s.encoder_loads:
        part += f" (encoder loaded in {duration(s.encoder_load_s)})"
    if hits:  # "new picture encoded …, picture from cache" read as one picture both ways
        part += ", the other from cache" if hits == 1 else f", {hits} others from cache"
    return part


def turn_line(stats: TurnStats) -> str:
    """One line for a finished turn; "" for a turn stopped before it began."""
    if isinstance(stats, RemoteTurnStats):
        parts = []
        if stats.cached_reported and stats.prompt_tokens:
            parts.append(f"The server had {stats.cached_tokens:,} of {stats.prompt_tokens:,} prompt tokens cached")
        parts.append(f"first text after {duration(stats.ttft_s)}")
        if stats.tokens_per_s:
            parts.append(f"{stats.tokens_per_s:.0f} tok/s")
        return " · ".join(parts)
    if not isinstance(stats, LocalTurnStats) or not stats.prompt_tokens:
        return ""
    parts = [_prompt_part(stats), _picture_part(stats)]
    if stats.generated_tokens and stats.tokens_per_s:
        parts.append(f"{stats.tokens_per_s:.0f} tok/s")
    return " · ".join(p for p in parts if p)
