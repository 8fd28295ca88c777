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
    """'1-3, 6' -> [0, 1, 2, 5] (1-based as typed; ValueError with one sentence when malformed).
    Linear in the text and `count`: a page already chosen is skipped by a jump over the run it
    is in, so "1-1000," typed 18,000 times costs one pass, not 18,000 (it took ~90 s)."""
    out: list[int] = []
    after = list(range(count + 1))  # after[i]: the first page at or after i not yet chosen (a path-halving jump table)

    def next_free(i: int) -> int:
        while after[i] != i:
            after[i] = after[after[i]]
            i = after[i]
        return i

    for part in (p.strip() for p in text.replace(";", ",").split(",")):
        if not part:
            continue
        a, _, b = part.partition("-")
        try:
            lo, hi = int(a), int(b) if b.strip() else int(a)
        except ValueError:
            raise ValueError(f"{part[:40]!r} is not a page number or range (like 1-3, 6)") from None
        if not (1 <= lo <= hi <= count):
            raise ValueError(f"pages {part[:40]} are not within 1-{count}")
        i = next_free(lo - 1)
        while i < hi:
            out.append(i)
            after[i] = i + 1
            i = next_free(i + 1)
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
