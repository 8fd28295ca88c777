"""One turn's model work on the owner thread: keep the reusable KV prefix (`reuse_prefix`), then
prefill the rest and decode (`run_turn`). The pipeline runs them in order with the picture
features between them (engine/local/pipeline.py).

Kept free of threads and queues: tokens and the stop check are callbacks, so the same code
serves the window, `ask`, `replay` and the API.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPooling

from ..model.kv_growth import full_attention
from ..pictures.span import PictureSpan, cut_after, cut_before
from ..protocol.events import Sampling
from ..protocol.settings import EngineSettings
from .detok import IncrementalDetokenizer
from .lookup_decode import DraftStats, NgramDrafter, accepted_prefix
from .prompt import Prompt
from .sampling import Sampler
from .session import Session


@dataclass
class TurnResult:
    reply: str
    token_ids: list[int]
    stopped: bool
    prompt_tokens: int
    prefix_tokens: int  # the prompt's opening already in the cache (hot or restored): not prefilled
    max_new_tokens: int  # the reply limit it ran with
    prefill_s: float
    first_token_s: float
    decode_s: float
    drafts: DraftStats


def _suffix_positions(full_pos: torch.Tensor | None, start: int, end: int, device) -> torch.Tensor:
    if full_pos is None:
        return torch.arange(start, end, device=device).unsqueeze(0)
    return full_pos[:, :, start:end].to(device)


def prefill_chunks(start: int, end: int, pictures: tuple[PictureSpan, ...], chunk: int) -> list[tuple[int, int]]:
    """Split [start, end) into pieces of about `chunk` tokens, never cutting through a picture
    (a picture longer than `chunk` is one piece). `start` may lie inside a picture (a restored
    prefix ended there): the first piece then runs to that picture's end at least."""
    chunk = max(1, chunk)
    out = []
    a = start
    while a < end:
        b = cut_before(min(end, a + chunk), pictures)
        if b <= a:
            b = cut_after(min(end, a + chunk), pictures)
        out.append((a, b))
        a = b
    return out


def _decode_positions(index: int, n: int, delta: int, mrope: bool, device) -> torch.Tensor:
    pos = torch.arange(index + delta, index + delta + n, device=device).unsqueeze(0)
    return pos.unsqueeze(0).expand(3, 1, n) if mrope else pos


def reuse_prefix(loaded, session: Session, prompt: Prompt) -> int:
    """The session keeps the longest prefix of `prompt` it holds (its cache cropped to it) or
    starts an empty cache; returns the tokens kept, which are not prefilled."""
    if not prompt.ids:
        raise ValueError("empty prompt")
    reuse = session.reusable_prefix(prompt)
    if reuse == 0:
        session.reset_to(prompt, 0, DynamicCache(config=loaded.model.config), rope_delta=prompt.rope_delta)
    else:
        session.reset_to(prompt, reuse, rope_delta=prompt.rope_delta)
    return reuse


@dataclass
class _Decoded:
    token_ids: list[int]
    text: str
    stopped: bool
    first_token_s: float  # from the start of the prefill
    drafts: DraftStats


@torch.inference_mode()
def run_turn(
    loaded,
    session: Session,
    prompt: Prompt,
    sampling: Sampling,
    settings: EngineSettings,
    on_text: Callable[[str, int], None],
    should_stop: Callable[[], bool],
) -> TurnResult:
    """Prefill what the session does not hold yet (its pictures' features are ready), then decode."""
    reuse = session.cached_tokens
    t0 = time.perf_counter()
    logits = _prefill(loaded, session, prompt, settings.prefill_chunk_tokens)
    prefill_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    out = _decode(
        loaded,
        session,
        logits,
        sampling,
        prompt.positions is not None,
        settings.lookup_decoding and sampling.greedy,
        on_text,
        should_stop,
        t0,
    )
    decode_s = time.perf_counter() - t1
    return TurnResult(
        reply=out.text,
        token_ids=out.token_ids,
        stopped=out.stopped,
        prompt_tokens=len(prompt.ids),
        prefix_tokens=reuse,
        max_new_tokens=sampling.max_new_tokens,
        prefill_s=prefill_s,
        first_token_s=out.first_token_s,
        decode_s=decode_s,
        drafts=out.drafts,
    )


def _prefill(loaded, session: Session, prompt: Prompt, chunk_tokens: int) -> torch.Tensor:
    """Run the prompt past the session's prefix in pieces (bounded attention memory on long
    conversations); the session grows with each piece, so a failure leaves it consistent.
    Returns the logits after the prompt's last token."""
    model, device = loaded.model, loaded.device
    out = None
    for a, b in prefill_chunks(session.cached_tokens, len(prompt.ids), prompt.pictures, chunk_tokens):
        kwargs = {}
        features = prompt.picture_features_in(a, b)  # by modality: pictures, and clips (native video)
        if features:
            # one tensor per picture, as the model's own encoder leaves it (a torch.split in the Qwen2-VL
            # family's get_image_features); the output class types the field as the single tensor
            kwargs["mm_encoder_outputs"] = {
                kind: BaseModelOutputWithPooling(pooler_output=[f.to(device=device, dtype=loaded.dtype) for f in fs])  # type: ignore[arg-type]
                for kind, fs in features.items()
            }
        try:
            out = model(
                input_ids=torch.tensor([prompt.ids[a:b]], device=device),
                cache=session.cache,
                position_ids=_suffix_positions(prompt.positions, a, b, device),
                use_cache=True,
                logits_to_keep=1,
                **kwargs,
            )
        except Exception:
            session.drop_kv()  # a half-written cache must never be reused
            raise
        session.grow_to(prompt, b)
    if out is None:  # reuse_prefix never keeps the prompt's last token: it is always run
        raise RuntimeError(f"nothing to prefill: the session holds all {len(prompt.ids)} prompt tokens")
    return out.logits[0, -1]


def _decode(
    loaded,
    session: Session,
    logits: torch.Tensor,
    sampling: Sampling,
    mrope: bool,
    lookup: bool,
    on_text: Callable[[str, int], None],
    should_stop: Callable[[], bool],
    t0: float,
) -> _Decoded:
    """Sample until the reply ends, is stopped or reaches max_new_tokens; the session takes each
    token the cache was given. With `lookup` (greedy only), prompt-lookup drafts are verified in
    the same pass and kept only where they equal the greedy choice. `mrope`: 3-D positions."""
    model, device = loaded.model, loaded.device
    sampler = Sampler(sampling, device)
    detok = IncrementalDetokenizer(loaded.tokenizer)
    generated: list[int] = []
    text_parts: list[str] = []
    stopped = False
    first_token_s = None
    drafter = None
    if lookup and all(full_attention(x) for x in session.cache.layers):
        drafter = NgramDrafter.over(session.ids, session.pictures, eos=loaded.eos_ids)
    drafts = DraftStats()
    verified: list[int] = []  # accepted draft tokens: already in the cache, not yet sent out
    while len(generated) < sampling.max_new_tokens:
        if should_stop():
            stopped = True
            if verified:  # the cache ran ahead of what was sent: crop it back
                session.crop(session.cached_tokens - len(verified))
            break
        in_cache = bool(verified)
        tok = verified.pop(0) if in_cache else sampler(logits)
        generated.append(tok)
        if first_token_s is None:
            first_token_s = time.perf_counter() - t0
        if tok in loaded.eos_ids:
            break
        piece = detok.push(tok)
        if piece:
            text_parts.append(piece)
        on_text(piece, tok)
        if len(generated) >= sampling.max_new_tokens:
            break
        if in_cache:
            continue
        draft = []
        if drafter:
            drafter.append(tok)
            # room is left for the model's own last token, as plain decoding never feeds it
            draft = drafter.draft(sampling.max_new_tokens - len(generated) - 1)
        index = session.cached_tokens
        ids = [tok] + draft
        try:
            out = model(
                input_ids=torch.tensor([ids], device=device),
                cache=session.cache,
                position_ids=_decode_positions(index, len(ids), session.rope_delta, mrope, device),
                use_cache=True,
                logits_to_keep=len(ids),
            )
        except Exception:
            session.drop_kv()
            raise
        if not draft:
            session.append([tok])
            logits = out.logits[0, -1]
            continue
        # choices[i]: greedy token after ids[:i + 1] (in fp32, as sampling.py picks)
        choices = out.logits[0].float().argmax(-1).tolist()
        n_ok = accepted_prefix(draft, choices)
        assert drafter is not None  # a draft comes only from the drafter
        session.append([tok] + draft[:n_ok])  # the KV of the rejected draft tokens is dropped
        for t in draft[:n_ok]:
            drafter.append(t)
        verified = draft[:n_ok]
        logits = out.logits[0, n_ok]
        drafter.feedback(len(draft), n_ok)
        drafts.drafted += len(draft)
        drafts.accepted += n_ok
        drafts.passes += 1
    tail = detok.flush()
    if tail:
        text_parts.append(tail)
        on_text(tail, -1)
    return _Decoded(generated, "".join(text_parts), stopped, first_token_s or 0.0, drafts)
