"""Where a picture sits in a token sequence, and the rules about cutting through one.

A picture's features go into the model with its tokens, so a prefill piece never cuts through a
picture, and a stored session never ends inside one (a stored span lies within its tokens): those
boundaries are moved out of pictures by `cut_before` / `cut_after`, here and nowhere else. A KV
prefix may end inside a picture, though: KV is causal, so the first tokens of the same picture
(same key) hold the same KV whatever follows, and a restore of whole blocks keeps the picture
tokens they hold; the turn then feeds only the remaining feature rows. The same PictureSpan goes
from the prompt (engine/local/prompt.py) to the KV store's block keys and manifest
(engine/kvstore/). Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NewType

# The picture cache's content key (engine/vision/entry.py: BLAKE3 over the picture's digest and the
# encoder's identity). Whatever a picture came from, this names its features.
PictureKey = NewType("PictureKey", bytes)


@dataclass(frozen=True, order=True)
class PictureSpan:
    """A picture's tokens occupy positions [start, end) of the sequence (its feature tokens and
    any layout markers between them)."""

    start: int
    end: int
    key: PictureKey

    def overlaps(self, a: int, b: int) -> bool:
        return self.start < b and self.end > a

    def splits_at(self, n: int) -> bool:
        """A boundary at `n` would cut through this picture."""
        return self.start < n < self.end


def cut_before(n: int, pictures: Iterable[PictureSpan]) -> int:
    """The last boundary at or before `n` that cuts through no picture."""
    return _out_of_pictures(n, tuple(pictures), lambda p: p.start)


def cut_after(n: int, pictures: Iterable[PictureSpan]) -> int:
    """The first boundary at or after `n` that cuts through no picture."""
    return _out_of_pictures(n, tuple(pictures), lambda p: p.end)


def _out_of_pictures(n: int, pictures: tuple[PictureSpan, ...], edge: Callable[[PictureSpan], int]) -> int:
    moved = True
    while moved:
        moved = False
        for p in pictures:
            if p.splits_at(n):
                n = edge(p)
                moved = True
    return n


def pictures_agree(start: int, end: int, mine: Iterable[PictureSpan], theirs: Iterable[PictureSpan]) -> int:
    """Two sequences hold the same token ids over [start, end): where the part on which they also
    hold the same pictures (same span, same key) ends. Picture tokens are one id repeated, so
    equal ids alone say nothing about which picture is there."""
    for p in set(mine) ^ set(theirs):
        if p.overlaps(start, end):
            end = min(end, max(start, p.start))
    return end
