"""A conversation's hot state: the tokens its KV cache holds and the cache itself."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .prompt import PicturePlacement, Prompt


@dataclass
class Session:
    conversation_id: str
    tags: list = field(default_factory=list)  # one per cached position (see prompt.Prompt.tags)
    cache: object | None = None  # transformers DynamicCache
    rope_delta: int = 0  # Qwen2-VL family: positions after the prompt continue at index + delta
    pictures: list[PicturePlacement] = field(default_factory=list)
    last_used: float = field(default_factory=time.monotonic)
    version: int = 0  # bumped by every turn: a spill finishing later must not free newer KV
    spilled: bool = False  # its KV lives in the SSD store (restored on the next turn)

    @property
    def cached_tokens(self) -> int:
        return len(self.tags) if self.cache is not None else 0

    def reusable_prefix(self, prompt: Prompt) -> int:
        """Longest prefix of `prompt` whose KV this session holds, never the whole prompt (the
        last token must be run to get logits) and never cutting through a picture."""
        if self.cache is None:
            return 0
        limit = min(len(self.tags), len(prompt.tags) - 1)
        n = 0
        old, new = self.tags, prompt.tags
        while n < limit and old[n] == new[n]:
            n += 1
        for p in prompt.pictures:
            if p.start < n < p.end:
                n = p.start
        return n

    def kv_bytes(self) -> int:
        if self.cache is None:
            return 0
        total = 0
        for layer in getattr(self.cache, "layers", []):
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if t is not None and hasattr(t, "numel"):
                    total += t.numel() * t.element_size()
        return total

    def drop_kv(self) -> None:
        self.cache = None
        self.tags = []
        self.pictures = []
        self.rope_delta = 0
