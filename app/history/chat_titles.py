"""A chat's name: its first question, as ChatGPT and LM Studio name theirs.

Earlier the name grew words from the first reply ("What shape is on the left? Circle"); a person
reads that as the answer standing in the sidebar, and a wrong reply put a wrong claim there. The
question is what the person asked for, in their own words. Two chats that began with the same
question are told apart by a number ("What is in this picture? (2)").
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from .history import DEFAULT_TITLE

MAX_CHARS = 48  # about what a 260 px sidebar shows in bold; the full question is the tooltip


def title_from(text: str, pictures: int) -> str:
    """The name a chat gets from its first question."""
    line = re.sub(r"\s+", " ", text).strip()
    if not line:
        return "Picture" if pictures == 1 else ("Pictures" if pictures else DEFAULT_TITLE)
    return line if len(line) <= MAX_CHARS else line[: MAX_CHARS - 1].rstrip() + "…"


def unique_title(title: str, taken: Iterable[str]) -> str:
    """`title`, or `title (2)`, `(3)`, … when another chat already has that name."""
    names = set(taken)
    n, named = 2, title
    while named in names:
        named, n = f"{title} ({n})", n + 1
    return named
