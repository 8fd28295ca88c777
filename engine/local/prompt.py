"""Turn a conversation into token ids, expanding each picture's placeholder from its cache entry.

The expansion text comes from the processor's own per-picture step (stored with the picture),
and the whole expanded text is tokenized once exactly as the processor would, so the ids equal
a fresh `processor(text=..., images=...)` while a cached picture needs no decode.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from ..pictures.span import PictureKey, PictureSpan
from ..protocol.events import Message
from ..vision.entry import PictureEntry


@dataclass(frozen=True)
class TextChunk:
    """Text tokens of the prompt: the template, the messages, the markers around pictures."""
    start: int  # position of its first token in the prompt
    ids: tuple[int, ...]

    @property
    def end(self) -> int:
        return self.start + len(self.ids)


@dataclass(frozen=True, eq=False)
class PictureChunk:
    """One picture's tokens: its feature tokens and the layout markers between them, which go into
    the model together. The entry (from the gate, whatever the picture came from: a file, and
    later a document page or a video frame) carries its key, token count and features."""
    span: PictureSpan  # where it sits in the prompt, and its key
    entry: PictureEntry
    ids: tuple[int, ...]

    @property
    def start(self) -> int:
        return self.span.start

    @property
    def end(self) -> int:
        return self.span.end

    @property
    def key(self) -> PictureKey:
        return self.span.key

    @property
    def n_tokens(self) -> int:
        """Feature rows: the picture's image tokens (its span may also hold markers)."""
        return self.entry.n_tokens


Chunk = TextChunk | PictureChunk


@dataclass(frozen=True, eq=False)
class Prompt:
    """A turn's prompt as an ordered list of chunks (text, picture, text, ...), like llama.cpp's
    mtmd_tokenize output, with the positions the model runs it at."""
    chunks: tuple[Chunk, ...]
    positions: torch.Tensor | None = None  # None: plain 0..L-1; Qwen2-VL family: 3-D positions
    rope_delta: int = 0  # Qwen2-VL family: positions after the prompt continue at index + delta

    @cached_property
    def ids(self) -> list[int]:
        return [t for c in self.chunks for t in c.ids]

    @cached_property
    def picture_chunks(self) -> tuple[PictureChunk, ...]:
        return tuple(c for c in self.chunks if isinstance(c, PictureChunk))

    @cached_property
    def pictures(self) -> tuple[PictureSpan, ...]:
        return tuple(c.span for c in self.picture_chunks)

    def pictures_from(self, start: int) -> list[PictureEntry]:
        """The pictures with tokens at or after `start` (one wholly inside a reused prefix needs
        nothing; one the prefix ends inside needs the features of its remaining tokens)."""
        return [c.entry for c in self.picture_chunks if c.end > start]

    def picture_features_in(self, a: int, b: int, image_token_id: int) -> list:
        """The feature rows of the picture tokens in [a, b), one tensor per picture there: a picture
        the range begins inside gives only its rows from `a` on (the cache holds the others)."""
        out = []
        for c in self.picture_chunks:
            if c.end <= a or c.start >= b:
                continue
            rows = c.entry.features
            if c.start < a:
                held = sum(1 for t in c.ids[:a - c.start] if t == image_token_id)
                rows = rows.reshape(-1, rows.shape[-1])[held:]
            out.append(rows)
        return out


def to_hf_messages(messages: list[Message], system_prompt: str | None) -> list[dict]:
    """Parley messages -> the HF chat-template shape (content parts, pictures first, each page or
    frame after its caption)."""
    out: list[dict] = []
    if system_prompt:
        out.append({"role": "system", "content": [{"type": "text", "text": system_prompt}]})
    for m in messages:
        if m.role not in ("system", "user", "assistant"):
            raise ValueError(f"unknown message role {m.role!r}")
        parts: list[dict] = []
        for p in m.images:  # a page or frame is named just before it; a plain picture is not
            if p.caption:
                parts.append({"type": "text", "text": p.caption + " "})
            parts.append({"type": "image"})
        parts.append({"type": "text", "text": m.text})
        out.append({"role": m.role, "content": parts})
    return out


def render(processor, messages: list[Message], system_prompt: str | None) -> str:
    return processor.apply_chat_template(
        to_hf_messages(messages, system_prompt), add_generation_prompt=True, tokenize=False
    )


def build_prompt(loaded, text: str, entries: list[PictureEntry]) -> Prompt:
    """`entries` are the pictures in order of appearance."""
    processor = loaded.processor
    n_placeholders = text.count(processor.image_token)
    if n_placeholders != len(entries):
        raise ValueError(
            f"the chat template produced {n_placeholders} picture placeholders for {len(entries)} pictures"
        )
    if entries:
        texts, _ = processor.get_text_with_replacements([text], images_replacements=[e.replacement for e in entries])
        text = texts[0]
    ids = list(processor.tokenizer(text, **loaded.merged_kwargs["text_kwargs"])["input_ids"])
    if ids and isinstance(ids[0], list):  # some tokenizers return a batch for one string
        ids = ids[0]
    image_id = loaded.image_token_id
    positions = [i for i, t in enumerate(ids) if t == image_id]
    chunks: list[Chunk] = []
    cursor = done = 0
    for e in entries:
        span = positions[cursor: cursor + e.n_tokens]
        if len(span) != e.n_tokens:
            raise ValueError("picture tokens in the prompt do not match the pictures' token counts")
        cursor += e.n_tokens
        start, end = span[0], span[-1] + 1
        if start > done:
            chunks.append(TextChunk(done, tuple(ids[done:start])))
        chunks.append(PictureChunk(PictureSpan(start, end, e.key), e, tuple(ids[start:end])))
        done = end
    if cursor != len(positions):
        raise ValueError("the prompt holds picture tokens that belong to no picture (is '<image>' typed in the text?)")
    if done < len(ids):
        chunks.append(TextChunk(done, tuple(ids[done:])))
    prompt = Prompt(tuple(chunks))
    pos, delta = _positions(loaded, prompt)
    return Prompt(prompt.chunks, pos, delta)


def _positions(loaded, prompt: Prompt) -> tuple[torch.Tensor | None, int]:
    """Positions for the whole prompt and the rope delta for tokens after it.

    None means plain 0..L-1 positions. Qwen2-VL family: 3-D positions from the model's own
    get_rope_index; the delta (max position + 1 - length) continues positions while decoding.
    """
    if not loaded.family.mrope or not prompt.picture_chunks:
        return None, 0
    ids = torch.tensor([prompt.ids], dtype=torch.long)
    types = torch.zeros_like(ids, dtype=torch.int32)
    for p in prompt.pictures:
        seg = ids[0, p.start:p.end] == loaded.image_token_id
        types[0, p.start:p.end] = seg.to(torch.int32)
    grids = torch.tensor([c.entry.grid_thw for c in prompt.picture_chunks], dtype=torch.long)
    pos, delta = loaded.model.model.get_rope_index(ids, mm_token_type_ids=types, image_grid_thw=grids)
    return pos, int(delta.reshape(-1)[0])
