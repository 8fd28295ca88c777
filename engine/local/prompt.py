"""Turn a conversation into token ids, expanding each picture's placeholder from its cache entry.

The expansion text comes from the processor's own per-picture step (stored with the picture),
and the whole expanded text is tokenized once exactly as the processor would, so the ids equal
a fresh `processor(text=..., images=...)` while a cached picture needs no decode.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..protocol.events import Message


@dataclass
class PicturePlacement:
    key: bytes
    start: int  # first token of the picture's span (inclusive)
    end: int  # last token + 1
    n_tokens: int  # image feature tokens inside the span


@dataclass
class Prompt:
    ids: list[int]
    tags: list  # per position: token id, or (token id, picture key) inside a picture span
    pictures: list[PicturePlacement] = field(default_factory=list)


def to_hf_messages(messages: list[Message], system_prompt: str | None) -> list[dict]:
    """Parley messages -> the HF chat-template shape (content parts, pictures first)."""
    out: list[dict] = []
    if system_prompt:
        out.append({"role": "system", "content": [{"type": "text", "text": system_prompt}]})
    for m in messages:
        if m.role not in ("system", "user", "assistant"):
            raise ValueError(f"unknown message role {m.role!r}")
        parts: list[dict] = [{"type": "image"} for _ in m.images]
        parts.append({"type": "text", "text": m.text})
        out.append({"role": m.role, "content": parts})
    return out


def render(processor, messages: list[Message], system_prompt: str | None) -> str:
    return processor.apply_chat_template(
        to_hf_messages(messages, system_prompt), add_generation_prompt=True, tokenize=False
    )


def build_prompt(loaded, text: str, entries: list) -> Prompt:
    """`entries` are the pictures in order of appearance (each has .key, .replacement, .n_tokens)."""
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
    tags: list = list(ids)
    placements: list[PicturePlacement] = []
    image_id = loaded.image_token_id
    positions = [i for i, t in enumerate(ids) if t == image_id]
    cursor = 0
    for e in entries:
        span = positions[cursor: cursor + e.n_tokens]
        if len(span) != e.n_tokens:
            raise ValueError("picture tokens in the prompt do not match the pictures' token counts")
        cursor += e.n_tokens
        start, end = span[0], span[-1] + 1
        for i in range(start, end):
            tags[i] = (ids[i], e.key)
        placements.append(PicturePlacement(e.key, start, end, e.n_tokens))
    if cursor != len(positions):
        raise ValueError("the prompt holds picture tokens that belong to no picture (is '<image>' typed in the text?)")
    return Prompt(ids=ids, tags=tags, pictures=placements)


def position_ids(loaded, prompt: Prompt, entries: list) -> tuple[torch.Tensor | None, int]:
    """Positions for the whole prompt and the rope delta for tokens after it.

    None means plain 0..L-1 positions. Qwen2-VL family: 3-D positions from the model's own
    get_rope_index; the delta (max position + 1 - length) continues positions while decoding.
    """
    if not loaded.adapter.mrope or not entries:
        return None, 0
    ids = torch.tensor([prompt.ids], dtype=torch.long)
    types = torch.zeros_like(ids, dtype=torch.int32)
    for p in prompt.pictures:
        seg = ids[0, p.start:p.end] == loaded.image_token_id
        types[0, p.start:p.end] = seg.to(torch.int32)
    grids = torch.tensor([e.grid_thw for e in entries], dtype=torch.long)
    pos, delta = loaded.model.model.get_rope_index(ids, mm_token_type_ids=types, image_grid_thw=grids)
    return pos, int(delta.reshape(-1)[0])
