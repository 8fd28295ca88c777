"""One turn, in order, each step calling only downwards: pictures looked up in the gate, the
prompt, the cut to the model's context, which conversation a stateless client continues, its
prefix restored from the SSD store, then

  reuse -> make room -> features -> run

(the session keeps its reusable prefix; memory is freed if the encoder must load; the pictures
after the prefix get their features; the runner prefills the rest and decodes), and the turn's
stats.

Runs on the engine's owner thread; the engine owns one per loaded model and handles the queue,
stop requests and failures around it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from ..device.ledger import model_bytes
from ..protocol.events import EncoderStatus, Token, Turn, TurnDone
from ..protocol.turn_stats import LocalTurnStats
from ..vision.gate import GateTurnStats, PictureGate
from ..vision.pictures import estimated_tokens
from .conversations import Conversations
from .memory_manager import MemoryManager
from .prompt import Prompt, build_prompt, model_pictures, render
from .rates import RateBook
from .runner import TurnResult, reuse_prefix, run_turn
from .session import Session
from .spill_scheduler import CommittedSpill, SpillScheduler


class TurnPipeline:
    def __init__(
        self,
        loaded,
        gate: PictureGate,
        sessions: Conversations,
        spill_scheduler: SpillScheduler,
        memory: MemoryManager,
        rates: RateBook,
    ):
        self.loaded = loaded
        self.rates = rates
        self.gate = gate
        self.sessions = sessions
        self.spill_scheduler = spill_scheduler
        self.memory = memory

    def run(self, turn: Turn, settings, emit: Callable, should_stop: Callable[[], bool]) -> TurnDone:
        """Run `turn`, emitting its tokens; returns its TurnDone for the engine to send. A bad turn
        (too long, no user message, an unreadable picture) raises ValueError before any KV is
        touched."""
        if not turn.messages or turn.messages[-1].role != "user":
            raise ValueError("A turn must end with a user message.")
        t_start = time.perf_counter()  # the first token's wait counts from here: restore and encode included
        gstats = GateTurnStats()
        video = self.loaded.family.native_video  # runs of frames go in as one clip each
        refs = [p for m in turn.messages for p in model_pictures(m.images, video)]
        hits = [self.gate.cached(p, gstats) for p in refs]
        text = render(self.loaded.processor, turn.messages, turn.system_prompt, video)
        self._check_room(turn, text, refs, hits)
        entries = [hit or self.gate.prepare(p, gstats) for p, hit in zip(refs, hits, strict=True)]
        prompt = build_prompt(self.loaded, text, entries)
        sampling = self._fit_to_context(prompt, turn)
        cid = turn.conversation_id or self._stateless_conversation(prompt)
        session = self.sessions.open(cid)
        session.begin_turn()
        self.memory.turn_started(cid)
        try:
            self.spill_scheduler.cancel_for(cid)
            self.memory.resume.before_turn(cid)  # a restore begun when the chat was opened ends now
            ahead = self.memory.resume.take(cid)
            restored, restore_s = self._restore(session, prompt)
            spilled = self.spill_scheduler.take_committed(cid)
            reuse = reuse_prefix(self.loaded, session, prompt)
            todo = prompt.pictures_from(reuse)
            needed = self.gate.load_bytes(todo)
            if needed:  # the encoder must load: idle conversations' KV may have to make way
                self.memory.make_room(needed)
            self.gate.ensure_features(todo, gstats)
            tid = turn.turn_id
            before_run_s = time.perf_counter() - t_start
            result = run_turn(
                self.loaded,
                session,
                prompt,
                sampling,
                settings,
                on_text=lambda text, tok: emit(Token(tid, cid, text, tok)),
                should_stop=should_stop,
            )
        finally:
            self.memory.turn_ended()
        session.touch()
        if result.prefill_s > 0:
            self.rates.record_prefill(result.prompt_tokens - result.prefix_tokens, result.prefill_s)
        if not restored and ahead is not None:  # the KV this turn started from was restored when the chat was opened
            restored = min(ahead.tokens, result.prefix_tokens)
            restore_s, restore_ahead_s = ahead.waited_s, ahead.ahead_s
        else:
            restore_ahead_s = 0.0
        stats = self._stats(result, restored, restore_s, restore_ahead_s, before_run_s, gstats, spilled)
        places = self.gate.places([p for m in turn.messages for p in m.images])  # the chat's pictures, cached now
        return TurnDone(tid, cid, result.reply, result.token_ids, stats, stopped=result.stopped, pictures=places)

    def _stateless_conversation(self, prompt: Prompt) -> str:
        """A stateless client (the API): continue whichever of its sessions fits best; the ones
        retired to make place are released (spilled first when the store can take them)."""
        cid, retired = self.sessions.match_stateless(prompt)
        for s in retired:
            self.memory.release_session(s)
        return cid

    def _restore(self, session: Session, prompt: Prompt) -> tuple[int, float]:
        t0 = time.perf_counter()
        restored = self.spill_scheduler.restore(session, prompt)
        return restored, time.perf_counter() - t0 if restored else 0.0

    def _check_room(self, turn: Turn, text: str, refs: list, hits: list) -> None:
        """Before any page is drawn or frame decoded: refuse a turn whose pictures cannot fit the
        context, from each page's or frame's size (engine/vision/pictures.py: estimated_tokens)
        and the text each brings (its caption, the markers around it), saying how many of this
        message's pictures would fit."""
        limit = self.loaded.context_tokens
        video = self.loaded.family.native_video
        mine = len(model_pictures(turn.messages[-1].images, video))
        if not limit or not mine:
            return
        todo = [i for i, hit in enumerate(hits) if hit is None]
        guess = dict(zip(todo, estimated_tokens(self.loaded, [refs[i] for i in todo]), strict=True))
        # a plain picture or a clip not yet read counts 0 here: the check after the prompt has its size
        cost = [hit.n_tokens if hit is not None else (guess[i] or 0) for i, hit in enumerate(hits)]
        # the text without this message's pictures; each picture adds its caption and markers
        bare = replace(turn.messages[-1], images=[])
        base = self._text_tokens(render(self.loaded.processor, [*turn.messages[:-1], bare], turn.system_prompt, video))
        ours = refs[len(refs) - mine :]
        captions = [self._text_tokens(r.prompt_caption + " ", special=False) if r.prompt_caption else 0 for r in ours]
        markers = (
            round((self._text_tokens(text) - base - sum(captions)) / mine) - 1
        )  # the placeholder is a picture token
        used = base + sum(cost[: len(refs) - mine])
        own = [c + cap + markers for c, cap in zip(cost[len(refs) - mine :], captions, strict=True)]
        if used + sum(own) < limit:
            return
        kept, total = 0, used
        for c in own:
            if total + c >= limit:
                break
            kept, total = kept + 1, total + c
        labels = [r.label for r in ours[kept:]]
        named = labels[0] if len(labels) == 1 else f"{labels[0]} … {labels[-1]}"
        line = (
            f"This message's {mine} pictures take about {sum(own)} tokens; with the {used} tokens of the "
            f"conversation that is more than the model's context of {limit} tokens."
        )
        if kept:
            line += f" Only the first {kept} fit (about {-(-sum(own[:kept]) // kept)} tokens each); left out: {named}."
        else:
            line += f" Not even the first fits (about {own[0]} tokens); start a new conversation for it."
        raise ValueError(line + " Send fewer pages or frames.")

    def _text_tokens(self, text: str, special: bool = True) -> int:
        kwargs = dict(self.loaded.merged_kwargs["text_kwargs"], add_special_tokens=special)
        ids = self.loaded.processor.tokenizer(text, **kwargs)["input_ids"]
        return len(ids[0] if ids and isinstance(ids[0], list) else ids)

    def _fit_to_context(self, prompt: Prompt, turn: Turn):
        """Refuse a prompt the model's context cannot hold, saying which of the message's pictures
        (pages, frames) would fit; shorten the reply to what fits (a copy: the caller's Turn is
        left as it was sent)."""
        limit, n_prompt, sampling = self.loaded.context_tokens, len(prompt.ids), turn.sampling
        if limit and n_prompt >= limit:
            mine = model_pictures(turn.messages[-1].images, self.loaded.family.native_video)
            raise ValueError(self._too_long(prompt, mine, limit))
        if limit and n_prompt + sampling.max_new_tokens > limit:
            sampling = replace(sampling, max_new_tokens=limit - n_prompt)
        return sampling

    @staticmethod
    def _too_long(prompt: Prompt, refs, limit: int) -> str:
        """The refusal after the prompt is built (a plain picture's size is known only then): how
        many of this message's pictures fit, each counted with the text it brings (its caption,
        the markers around it), which the count once left in the conversation's share: 1,000
        captions alone filled it, and it said "Only the first 0 … fit" where 44 did."""
        line = f"This conversation is {len(prompt.ids)} tokens long, more than the model's context of {limit} tokens."
        mine = prompt.picture_chunks[len(prompt.picture_chunks) - len(refs) :] if refs else ()
        if not mine:
            return line + " Start a new conversation (or send fewer pictures)."
        ends = [c.end for c in mine]
        # a picture costs from the end of the one before it (its caption and markers) to its own end
        cost = [ends[0] - mine[0].start + (mine[1].start - ends[0] if len(mine) > 1 else 0)]
        cost += [b - a for a, b in zip(ends, ends[1:], strict=False)]
        kept, total = 0, len(prompt.ids) - sum(cost)
        for c in cost:
            if total + c >= limit:
                break
            kept, total = kept + 1, total + c
        if kept == len(refs):
            return line + " Start a new conversation (or send fewer pictures)."
        left = [r.label for r in refs[kept:]]
        named = left[0] if len(left) == 1 else f"{left[0]} … {left[-1]}"
        return (
            line + f" Only the first {kept} of this message's {len(refs)} pictures fit "
            f"(about {-(-sum(cost) // len(cost))} tokens each); left out: {named}. Send fewer pages or frames."
        )

    def _stats(
        self,
        result: TurnResult,
        restored: int,
        restore_s: float,
        restore_ahead_s: float,
        before_run_s: float,
        gstats: GateTurnStats,
        spilled: CommittedSpill,
    ) -> LocalTurnStats:
        n_gen = len(result.token_ids)
        return LocalTurnStats(
            prompt_tokens=result.prompt_tokens,
            generated_tokens=n_gen,
            # lookups, restore and encode come before the prefill: a first token never beats them
            first_token_s=round(before_run_s + result.first_token_s, 6) if n_gen else 0.0,
            decode_s=round(result.decode_s, 6),
            tokens_per_s=round(n_gen / result.decode_s, 3) if result.decode_s > 0 and n_gen else 0.0,
            # the prefix the turn did not prefill: reused = hot in RAM, restored = read from the SSD store
            reused_tokens=result.prefix_tokens - restored,
            restored_tokens=restored,
            prefill_tokens=result.prompt_tokens - result.prefix_tokens,
            max_new_tokens=result.max_new_tokens,
            prefill_s=round(result.prefill_s, 6),
            restore_s=round(restore_s, 6),
            restore_ahead_s=round(restore_ahead_s, 6),
            reread_estimate_s=self.rates.rates().prefill_s(result.prefix_tokens) if result.prefix_tokens else None,
            draft_tokens=result.drafts.drafted,
            draft_accepted=result.drafts.accepted,
            draft_acceptance=round(result.drafts.acceptance, 4),
            encode_s=round(gstats.encode_s, 6),
            encoder_loads=gstats.encoder_loads,
            encoder_load_s=round(gstats.load_s, 6),
            encoder_resident=self.gate.encoder_state == EncoderStatus.RESIDENT,
            image_cache_hits=gstats.hits,
            image_cache_ram_hits=gstats.ram_hits,
            image_cache_disk_hits=gstats.disk_hits,
            image_cache_misses=gstats.misses,
            pictures_encoded=gstats.encoded,
            spill_blocks_written=spilled.blocks_written,
            spill_blocks_reused=spilled.blocks_reused,
            weights=self.loaded.weights,
            weight_bytes=model_bytes(self.loaded)[0],
        )
