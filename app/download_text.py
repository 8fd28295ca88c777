"""How sizes and a download's progress read on the Models page: decimal units (1 GB = 10^9 B),
as the Hub and disk tools show download sizes (the memory dock uses binary units: memory_bar)."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def progress_text(p) -> str:
    eta = "" if p.eta_s is None else f", {int(p.eta_s) // 60}:{int(p.eta_s) % 60:02d} left"
    return f"{human_bytes(p.done_bytes)} of {human_bytes(p.total_bytes)} at {human_bytes(p.speed_bps)}/s{eta}"
