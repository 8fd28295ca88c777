"""A conversation's hot state: the tokens its KV cache holds and the cache itself.

Session is the only owner of that state. Its invariant: `cache` holds the KV of exactly `ids`
with `pictures` at their places (cache None: nothing is held). `pictures` are the pictures the
held tokens reach into, with their whole spans: a restore of whole blocks may end inside one, and
the next turn prefills only its remaining tokens. Every change goes through a method here, each of which keeps
the two together; the fields are read-only properties to everyone else.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..model.kv_growth import with_room
from ..pictures.span import PictureSpan, pictures_agree
from .prompt import Prompt

if TYPE_CHECKING:
    from transformers import DynamicCache


class Session:
    def __init__(self, conversation_id: str):
        self._conversation_id = conversation_id
        self._ids: list[int] = []
        self._cache: DynamicCache | None = None
        self._rope_delta = 0  # Qwen2-VL family: positions after the prompt continue at index + delta
        self._pictures: tuple[PictureSpan, ...] = ()
        self._reply_start = 0  # where the last turn's reply begins in _ids (before it: that turn's prompt)
        self._last_used = time.monotonic()
        self._version = 0  # bumped by every turn: a spill finishing later must not free newer KV

    # ------------------------------------------------------------ read-only state

    @property
    def conversation_id(self) -> str:
        return self._conversation_id

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(self._ids)

    @property
    def cache(self):
        return self._cache

    @property
    def rope_delta(self) -> int:
        return self._rope_delta

    @property
    def pictures(self) -> tuple[PictureSpan, ...]:
        return self._pictures

    @property
    def reply_start(self) -> int:
        """Where the last turn's reply begins in `ids`: the tokens before it were that turn's
        prompt, so a turn that keeps fewer of them changed a message before the reply (an edit,
        a switch to another version), while one that keeps them all goes on."""
        return self._reply_start

    @property
    def last_used(self) -> float:
        return self._last_used

    @property
    def version(self) -> int:
        return self._version

    @property
    def cached_tokens(self) -> int:
        return len(self._ids) if self._cache is not None else 0

    def kv_bytes(self) -> int:
        if self._cache is None:
            return 0
        total = 0
        for layer in getattr(self._cache, "layers", []):
            held = (
                layer.held()
                if hasattr(layer, "held")
                else (getattr(layer, "keys", None), getattr(layer, "values", None))
            )
            for t in held:  # a growing layer's spare room is held memory too
                if t is not None and hasattr(t, "numel"):
                    total += t.numel() * t.element_size()
        return total

    def reusable_prefix(self, prompt: Prompt) -> int:
        """Longest prefix of `prompt` whose KV this session holds, never the whole prompt (the
        last token must be run to get logits), with the same pictures over it. It may end inside
        a picture both hold: KV is causal, so the first tokens of the same picture are the same."""
        if self._cache is None:
            return 0
        limit = min(len(self._ids), len(prompt.ids) - 1)
        n = 0
        old, new = self._ids, prompt.ids
        while n < limit and old[n] == new[n]:
            n += 1
        return pictures_agree(0, n, self._pictures, prompt.pictures)

    # ------------------------------------------------------------ changes

    def touch(self) -> None:
        self._last_used = time.monotonic()

    def begin_turn(self) -> None:
        """A turn of this conversation starts: a spill begun before it must not free its KV."""
        self.touch()
        self._version += 1

    def reset_to(self, prompt: Prompt, n: int, cache=None, rope_delta: int = 0) -> None:
        """Hold the first `n` tokens of `prompt`: in `cache` when given (it holds exactly them:
        a fresh cache for n = 0, or one restored from the store), else in this session's own
        cache cropped to them (they must be a reusable prefix)."""
        if cache is not None:
            self._cache = with_room(cache)  # K/V grow in place, not copied whole for each token
        elif self._cache is None or n > len(self._ids):
            raise ValueError(f"the session holds {self.cached_tokens} tokens, not {n}")
        elif len(self._ids) > n:
            self._cache.crop(n - len(self._ids))
        self._reply_start = n if cache is not None else min(self._reply_start, n)
        self._ids = prompt.ids[:n]
        self._pictures = tuple(p for p in prompt.pictures if p.start < n)
        self._rope_delta = rope_delta

    def splice(self, prompt: Prompt, start: int, end: int, cache) -> None:
        """Hold the first `end` tokens of `prompt`: its first `start` from this session's own
        cache (cropped to them: they must be a reusable prefix), the rest from `cache`, which
        holds exactly tokens start..end (restored from the store). The restored K/V are appended
        layer by layer: KV is causal, so the same opening's K/V are the same wherever they came from."""
        import torch  # loaded by now: a session holding a cache came from a model

        if self._cache is None or start > len(self._ids):
            raise ValueError(f"the session holds {self.cached_tokens} tokens, not {start}")
        try:
            if len(self._ids) > start:
                self._cache.crop(start - len(self._ids))
            with torch.inference_mode():  # the cache's tensors are inference tensors: updated only in this mode
                for layer, part in zip(self._cache.layers, cache.layers, strict=True):
                    # a store only holds plain full-attention layers (kvstore/layout.py), whose update appends
                    layer.update(part.keys, part.values)  # type: ignore[union-attr]
        except Exception:
            self.drop_kv()  # half spliced: never reused
            raise
        self._reply_start = min(self._reply_start, start)
        self._ids = prompt.ids[:end]
        self._pictures = tuple(p for p in prompt.pictures if p.start < end)

    def hold(
        self,
        ids: list[int],
        pictures: tuple[PictureSpan, ...],
        cache,
        rope_delta: int = 0,
        reply_start: int | None = None,
    ) -> None:
        """Hold a cache restored from the store ahead of any prompt: it holds exactly `ids`, with
        `pictures` over them (whole spans, also of a picture the restore ended inside), the last
        reply beginning at `reply_start` (not known: all of it counts as prompt)."""
        if cache is None or not ids:
            raise ValueError("nothing to hold")
        self._cache = with_room(cache)  # K/V grow in place, as in reset_to
        self._reply_start = len(ids) if reply_start is None else min(reply_start, len(ids))
        self._ids = list(ids)
        self._pictures = tuple(p for p in pictures if p.start < len(ids))
        self._rope_delta = rope_delta

    def grow_to(self, prompt: Prompt, end: int) -> None:
        """The cache was given `prompt`'s tokens up to `end` (the session held a prefix of it)."""
        self._ids.extend(prompt.ids[len(self._ids) : end])
        self._pictures = tuple(p for p in prompt.pictures if p.start < end)
        if end == len(prompt.ids):  # the prompt is in: what comes next is the reply
            self._reply_start = end

    def append(self, tokens: list[int]) -> None:
        """The cache was given `tokens` (decoded text), perhaps followed by draft tokens that were
        rejected: those are cropped off."""
        self._ids.extend(tokens)
        self._crop_cache(len(self._ids))

    def crop(self, n: int) -> None:
        """Keep only the first `n` tokens (a reply stopped after its cache ran ahead)."""
        del self._ids[n:]
        self._pictures = tuple(p for p in self._pictures if p.start < n)
        self._reply_start = min(self._reply_start, n)
        self._crop_cache(n)

    def drop_kv(self) -> None:
        """Hold nothing (freed, or a half-written cache that must never be reused)."""
        self._cache = None
        self._ids = []
        self._pictures = ()
        self._rope_delta = 0
        self._reply_start = 0

    def _crop_cache(self, n: int) -> None:
        if self._cache is None:
            raise RuntimeError(f"conversation {self._conversation_id} holds no KV to crop to {n} tokens")
        extra = self._cache.get_seq_length() - n
        if extra > 0:
            self._cache.crop(-extra)  # this transformers takes only "remove N" here
