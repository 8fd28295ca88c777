"""How a size reads anywhere in the window: binary units with their IEC names (1 MiB = 2^20 B).

One unit, so a model's download on the Models page, its weights in the Memory dock and the
Settings limits (MiB) can be compared at a glance. Binary, because most of what Parley sizes is
memory (RAM and VRAM come in powers of two, and the engine's fit lines say GiB); the IEC names
keep it from being read as decimal where a file manager counts in GB (GNOME, Finder)."""

from __future__ import annotations


def human_bytes(n: int | float | None) -> str:
    if n is None:
        return "—"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def exact_bytes(n: int | None) -> str:
    if n is None:
        return "—"
    return f"{int(n):,} B" if abs(n) < 1024 else f"{human_bytes(n)} ({int(n):,} B)"
