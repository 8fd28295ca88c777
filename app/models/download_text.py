"""How a download's progress reads on the Models page (sizes in app.sizes' units)."""

from __future__ import annotations

from ..sizes import human_bytes


def progress_text(p) -> str:
    eta = "" if p.eta_s is None else f", {int(p.eta_s) // 60}:{int(p.eta_s) % 60:02d} left"
    return f"{human_bytes(p.done_bytes)} of {human_bytes(p.total_bytes)} at {human_bytes(p.speed_bps)}/s{eta}"
