"""Prompt-lookup decoding: draft the next tokens by finding the conversation's latest n-gram
earlier in it, and check the whole draft in one forward pass.

Chat about pictures repeats itself ("the red circle on the left", lists, code), so a reply often
continues a span already in the prompt. The model verifies the draft in one pass; a greedy turn
keeps exactly the draft tokens that match its own argmax and the first token where they differ,
so the reply is by construction the greedy one. When nothing repeats there is no draft and a
step costs one ordinary decode pass.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..pictures.span import PictureSpan

PICTURE = -1  # picture positions never match text (the same placeholder id repeats in every picture)


@dataclass
class DraftStats:
    drafted: int = 0  # draft tokens sent for verification
    accepted: int = 0  # of those, kept (equal to the greedy choice)
    passes: int = 0  # verification passes that carried a draft

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


class NgramDrafter:
    """Index of the turn's token sequence by its 1..max_ngram-grams -> where each last occurred.

    The index maps an n-gram to the position of the token that followed its most recent earlier
    occurrence; an n-gram ending at the current end is registered only when the next token is
    appended, so a lookup never finds the suffix itself."""

    def __init__(
        self,
        ids: list[int],
        max_ngram: int = 3,
        max_draft: int = 10,
        eos: set[int] | frozenset[int] = frozenset(),
        min_ngram: int = 2,
        max_rest: int = 64,
    ):
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram  # a single repeated token predicts little: a verify pass wasted
        self.max_draft = max_draft
        self.eos = eos
        self.draft_len = 4  # adapts: grows while drafts are taken whole, shrinks when cut
        self.rest = 0  # steps to skip drafting after drafts were refused outright
        self._backoff = 0
        self.max_rest = max_rest
        self.seq: list[int] = []
        self.follow: dict[tuple[int, ...], int] = {}
        for t in ids:
            self.append(t)

    @classmethod
    def over(cls, ids: Iterable[int], pictures: Iterable[PictureSpan], **kwargs) -> NgramDrafter:
        """A drafter over a sequence whose picture positions never match text."""
        seq = list(ids)
        for p in pictures:
            seq[p.start : p.end] = [PICTURE] * (p.end - p.start)
        return cls(seq, **kwargs)

    def append(self, tok: int) -> None:
        seq, end = self.seq, len(self.seq)
        for n in range(1, min(self.max_ngram, end) + 1):
            gram = tuple(seq[end - n : end])
            if PICTURE not in gram:
                self.follow[gram] = end
        seq.append(tok)

    def draft(self, limit: int) -> list[int]:
        """Up to min(limit, the adaptive length) tokens that followed the longest matching
        n-gram last time; never a picture position or an end-of-sequence token (the reply ends
        on a token the model chose itself)."""
        k = min(limit, self.draft_len)
        if self.rest > 0:
            self.rest -= 1
            return []
        if k <= 0:
            return []
        seq = self.seq
        for n in range(min(self.max_ngram, len(seq)), self.min_ngram - 1, -1):
            start = self.follow.get(tuple(seq[-n:]))
            if start is None:
                continue
            out = []
            for t in seq[start : start + k]:
                if t == PICTURE or t in self.eos:
                    break
                out.append(t)
            if out:
                return out
        return []

    def feedback(self, drafted: int, accepted: int) -> None:
        if accepted == drafted:
            self.draft_len = min(self.max_draft, self.draft_len + 2)
        else:
            self.draft_len = max(1, self.draft_len - 1)
        # text that does not repeat keeps refusing drafts: pause drafting for 2, 4 ... 64 steps
        # so a reply with nothing to look up costs about what plain decoding costs
        self._backoff = 0 if accepted else min(self.max_rest, max(2, 2 * self._backoff))
        self.rest = self._backoff


def accepted_prefix(draft: list[int], choices: list[int]) -> int:
    """How many draft tokens equal the model's own choices (choices[i] follows draft[:i])."""
    n = 0
    while n < len(draft) and draft[n] == choices[n]:
        n += 1
    return n
