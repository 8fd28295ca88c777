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
from ..pictures.video import as_clips
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
    the model together. The entry (from the gate, whatever the picture came from: a file, a
    document's page, a video's frame or a clip of frames) carries its key, token count and features."""

    span: PictureSpan  # where it sits in the prompt, and its key (a video clip: one span)
    entry: PictureEntry
    ids: tuple[int, ...]
    token_id: int  # its feature tokens' id (the image token, or a clip's video token)

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

    def picture_features_in(self, a: int, b: int) -> dict[str, list]:
        """The feature rows of the picture tokens in [a, b) by modality ("image", "video"), one
        tensor per picture there: a picture the range begins inside gives only its rows from `a`
        on (the cache holds the others)."""
        out: dict[str, list] = {}
        for c in self.picture_chunks:
            if c.end <= a or c.start >= b:
                continue
            rows = c.entry.features
            if rows is None:  # the vision gate encodes every picture of the prompt before the prefill
                raise RuntimeError(f"picture at tokens {c.start}-{c.end} reached the prefill without its features")
            if c.start < a:
                held = sum(1 for t in c.ids[: a - c.start] if t == c.token_id)
                rows = rows.reshape(-1, rows.shape[-1])[held:]
            out.setdefault(c.entry.modality, []).append(rows)
        return out


def model_pictures(images, native_video: bool) -> list:
    """A message's pictures as the model takes them: with native video input, each run of frames
    of one video is one clip."""
    return as_clips(images) if native_video else list(images)


def to_hf_messages(messages: list[Message], system_prompt: str | None, native_video: bool = False) -> list[dict]:
    """Parley messages -> the HF chat-template shape (content parts, pictures first, each page or
    frame after its caption, "report.pdf, page 3:"; with `native_video`, a run of frames as one video)."""
    out: list[dict] = []
    if system_prompt:
        out.append({"role": "system", "content": [{"type": "text", "text": system_prompt}]})
    for m in messages:
        if m.role not in ("system", "user", "assistant"):
            raise ValueError(f"unknown message role {m.role!r}")
        parts: list[dict] = []
        for p in model_pictures(m.images, native_video):  # a page or frame is named just before it
            if p.prompt_caption:
                parts.append({"type": "text", "text": p.prompt_caption + " "})
            parts.append({"type": p.modality})
        parts.append({"type": "text", "text": m.text})
        out.append({"role": m.role, "content": parts})
    return out


def render(processor, messages: list[Message], system_prompt: str | None, native_video: bool = False) -> str:
    return processor.apply_chat_template(
        to_hf_messages(messages, system_prompt, native_video), add_generation_prompt=True, tokenize=False
    )


def build_prompt(loaded, text: str, entries: list[PictureEntry]) -> Prompt:
    """`entries` are the pictures (and clips) in order of appearance."""
    processor = loaded.processor
    token_ids = {"image": loaded.image_token_id, "video": _video_token_id(loaded)}
    by_kind = {k: [e for e in entries if e.modality == k] for k in token_ids}
    n_placeholders = text.count(processor.image_token) + (text.count(processor.video_token) if by_kind["video"] else 0)
    if n_placeholders != len(entries):
        raise ValueError(
            f"the chat template produced {n_placeholders} picture placeholders for {len(entries)} pictures"
        )
    if entries:
        texts, _ = processor.get_text_with_replacements(
            [text],
            images_replacements=[e.replacement for e in by_kind["image"]],
            videos_replacements=[e.replacement for e in by_kind["video"]],
        )
        text = texts[0]
    ids = list(processor.tokenizer(text, **loaded.merged_kwargs["text_kwargs"])["input_ids"])
    if ids and isinstance(ids[0], list):  # some tokenizers return a batch for one string
        ids = ids[0]
    positions = {k: [i for i, t in enumerate(ids) if t == tid] for k, tid in token_ids.items() if tid is not None}
    cursor = {k: 0 for k in positions}
    chunks: list[Chunk] = []
    done = 0
    for e in entries:
        at = cursor[e.modality]
        span = positions[e.modality][at : at + e.n_tokens]
        if len(span) != e.n_tokens:
            raise ValueError("picture tokens in the prompt do not match the pictures' token counts")
        cursor[e.modality] += e.n_tokens
        start, end = span[0], span[-1] + 1
        if start > done:
            chunks.append(TextChunk(done, tuple(ids[done:start])))
        chunks.append(PictureChunk(PictureSpan(start, end, e.key), e, tuple(ids[start:end]), token_ids[e.modality]))
        done = end
    checked = ["image"] + (["video"] if by_kind["video"] else [])  # without a clip a video token is only text
    if any(cursor[k] != len(positions[k]) for k in checked):
        raise ValueError("the prompt holds picture tokens that belong to no picture (is '<image>' typed in the text?)")
    if done < len(ids):
        chunks.append(TextChunk(done, tuple(ids[done:])))
    prompt = Prompt(tuple(chunks))
    pos, delta = _positions(loaded, prompt)
    return Prompt(prompt.chunks, pos, delta)


def _video_token_id(loaded) -> int | None:
    token = getattr(loaded.processor, "video_token", None) if loaded.family.native_video else None
    return loaded.processor.tokenizer.convert_tokens_to_ids(token) if token else None


def _positions(loaded, prompt: Prompt) -> tuple[torch.Tensor | None, int]:
    """Positions for the whole prompt and the rope delta for tokens after it.

    None means plain 0..L-1 positions. Qwen2-VL family: 3-D positions from the model's own
    get_rope_index (token type 1 for a picture's tokens, 2 for a clip's); the delta (max position
    + 1 - length) continues positions while decoding.
    """
    if not loaded.family.mrope or not prompt.picture_chunks:
        return None, 0
    ids = torch.tensor([prompt.ids], dtype=torch.long)
    types = torch.zeros_like(ids, dtype=torch.int32)
    grids: dict[str, list] = {"image": [], "video": []}
    seconds = []
    for c in prompt.picture_chunks:
        seg = ids[0, c.start : c.end] == c.token_id
        types[0, c.start : c.end] = seg.to(torch.int32) * (2 if c.entry.modality == "video" else 1)
        grids[c.entry.modality].append(c.entry.grid_thw)
        if c.entry.modality == "video" and c.entry.second_per_grid is not None:
            seconds.append(c.entry.second_per_grid)
    kwargs = {f"{k}_grid_thw": torch.tensor(v, dtype=torch.long) for k, v in grids.items() if v}
    if seconds:
        kwargs["second_per_grid_ts"] = torch.tensor(seconds)
    pos, delta = loaded.model.model.get_rope_index(ids, mm_token_type_ids=types, **kwargs)
    return pos, int(delta.reshape(-1)[0])
