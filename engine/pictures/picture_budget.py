"""How many of a turn's pictures fit the model's context: a per-turn picture-token budget, and
one sentence naming the pages or frames left out. Torch-free; the token count of one picture
comes from the engine (engine/vision/pictures.py: tokens_per_picture) or a measured turn."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_SHARE = 0.75  # of the context left after the conversation: the reply and the text need the rest


@dataclass(frozen=True)
class BudgetChoice:
    kept: tuple[int, ...]  # indexes (pages, frames) sent, in order
    left_out: tuple[int, ...]
    line: str | None  # one sentence when something was left out, else None


def ranges_text(indexes: tuple[int, ...] | list[int]) -> str:
    """(0, 1, 2, 5) -> '1-3, 6' (1-based, as people number pages)."""
    out: list[str] = []
    xs = sorted(indexes)
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(f"{xs[i] + 1}" if i == j else f"{xs[i] + 1}-{xs[j] + 1}")
        i = j + 1
    return ", ".join(out)


def parse_ranges(text: str, count: int) -> list[int]:
    """'1-3, 6' -> [0, 1, 2, 5] (1-based as typed; ValueError with one sentence when malformed)."""
    out: list[int] = []
    for part in (p.strip() for p in text.replace(";", ",").split(",")):
        if not part:
            continue
        a, _, b = part.partition("-")
        try:
            lo, hi = int(a), int(b) if b.strip() else int(a)
        except ValueError:
            raise ValueError(f"{part!r} is not a page number or range (like 1-3, 6)") from None
        if not (1 <= lo <= hi <= count):
            raise ValueError(f"pages {part} are not within 1-{count}")
        out.extend(i for i in range(lo - 1, hi) if i not in out)
    if not out:
        raise ValueError("no pages chosen")
    return out


def fit(
    indexes: list[int],
    tokens_each: int,
    context_tokens: int | None,
    used_tokens: int = 0,
    what: str = "pages",
    name: str = "",
    share: float = DEFAULT_SHARE,
) -> BudgetChoice:
    """Keep the first of `indexes` whose pictures fit `share` of the context the conversation
    (`used_tokens`) leaves free; say which were left out."""
    if not context_tokens or tokens_each <= 0:
        return BudgetChoice(tuple(indexes), (), None)
    budget = int((context_tokens - used_tokens) * share)
    n = max(0, min(len(indexes), budget // tokens_each))
    kept, left = tuple(indexes[:n]), tuple(indexes[n:])
    if not left:
        return BudgetChoice(kept, (), None)
    of = f" of {name}" if name else ""
    numbers = ranges_text(left) if what == "pages" else f"{len(left)}"
    line = (
        f"Only {n} {what}{of} fit the model's context (about {tokens_each} tokens each); left out: {what} {numbers}."
        if what == "pages"
        else f"Only {n} {what}{of} fit the model's context (about {tokens_each} tokens each); "
        f"{numbers} later {what} left out."
    )
    return BudgetChoice(kept, left, line)
