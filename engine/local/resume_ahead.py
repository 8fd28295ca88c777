"""Resume before the person asks: the chat that was opened, if its KV is on the SSD, is read back
in the background, so its first turn (after a restart too) starts from hot KV.

It runs on the owner thread between requests, one blob per step, and gives way at once: a turn
of another conversation cancels it (a turn of this one finishes it, since the turn needs it
anyway), opening another chat cancels it, and so does memory running short between blobs. It
never begins a restore that memory cannot hold. The memory manager owns one and drives it from
its idle work; the pipeline asks it before a turn. Each call says whether where a conversation's
KV is changed (a restore began, moved on, ended or was held back), for the engine to tell.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ..device.ledger import free_for_model
from ..kvstore import SessionRestoreJob
from .conversations import Conversations
from .rates import RateBook
from .spill_scheduler import SpillScheduler

MiB = 1 << 20
PROGRESS_EVERY_S = 0.25  # how often a running restore says how far it got
PROBE_BLOBS = 4  # read to time the disk when no restore was timed yet (one to warm up)


@dataclass
class RestoredAhead:
    """A restore begun when its chat was opened, not yet used by a turn."""

    tokens: int
    ahead_s: float  # spent restoring in the background, before the turn
    waited_s: float  # the rest, which the turn finished (it came in mid-restore)


@dataclass
class _Running:
    conversation_id: str
    job: SessionRestoreJob
    memory_bytes: int
    turn_s: float = 0.0  # of job.seconds, the part a turn waited for (it finished the job)


def _mib(n: int) -> str:
    return f"{n / MiB:,.0f} MiB"


class ResumeAhead:
    def __init__(self, loaded, sessions: Conversations, spill_scheduler: SpillScheduler, rates: RateBook, settings):
        self.loaded = loaded
        self.sessions = sessions
        self.spill_scheduler = spill_scheduler
        self.rates = rates
        self.settings = settings
        self.open_cid: str | None = None  # the chat the person has open
        self._wanted: str | None = None  # the open chat, until it is restored or found not to need it
        self.running: _Running | None = None
        self.held_back: dict[str, str] = {}  # conversation id -> why it was not restored ahead
        self._done: dict[str, RestoredAhead] = {}

    def apply_settings(self, settings) -> None:
        self.settings = settings

    # ------------------------------------------------------------ what the engine is told

    def open(self, conversation_id: str | None) -> None:
        """The person opened this chat (None: none): a restore of another chat stops; this one's
        begins with the next idle step."""
        if self.running is not None and self.running.conversation_id != conversation_id:
            self._cancel()
        self.open_cid = self._wanted = conversation_id or None

    def spilled_by_hand(self, conversation_id: str) -> None:
        """The person asked for this chat's KV to go to the SSD: it is not brought back until the
        chat is opened again."""
        if self._wanted == conversation_id:
            self._wanted = None
        if self.running is not None and self.running.conversation_id == conversation_id:
            self._cancel()

    def progress(self, conversation_id: str) -> tuple[int, int] | None:
        """(tokens read back, tokens in all) while this conversation is being restored."""
        r = self.running
        if r is None or r.conversation_id != conversation_id:
            return None
        return r.job.done_tokens, r.job.n_tokens

    # ------------------------------------------------------------ owner thread, between requests

    def start(self) -> bool:
        """Begin restoring the open chat if it is on the SSD only and memory holds it; True when
        a restore began."""
        cid, sp = self._wanted, self.spill_scheduler
        if cid is None or self.running is not None or sp.store is None:
            return False
        session = self.sessions.get(cid)
        stored = next((s for s in sp.store.stored_sessions() if s.id == cid), None)
        if stored is None or (session is not None and session.cache is not None):
            self._wanted = None  # hot already, or nothing stored: once it goes cold later, that was for memory
            return False
        need = stored.memory_bytes(self.loaded.dtype)
        free, margin = free_for_model(self.loaded, self.sessions.kv_bytes(), self.settings.memory_budget_bytes)
        if free < need + margin:
            why = f"memory is short ({_mib(need)} needed, {_mib(max(0, free - margin))} free)"
            changed = self.held_back.get(cid) != why
            self.held_back[cid] = why
            return changed
        job = sp.store.begin_session_restore(cid, self.loaded.device, self.loaded.dtype)
        if job is None:
            return False
        self.held_back.pop(cid, None)
        self.running = _Running(cid, job, need)
        return True

    def measure(self) -> bool:
        """No restore speed was measured on this machine yet while the store holds a chat: read a
        few blobs of it back (verified, then let go) and time them, so the first estimate shown is
        a measured one. The first blob only warms up (first calls, buffers): a single short timing
        on a busy machine read 0.4 s for a 0.15 s restore. True when it measured."""
        store = self.spill_scheduler.store
        if self.rates.restore.rate is not None or store is None:
            return False
        stored = store.stored_sessions()
        job = (
            store.begin_session_restore(stored[0].id, self.loaded.device, self.loaded.dtype, blobs=PROBE_BLOBS)
            if stored
            else None
        )
        if job is None:
            return False
        job.step()
        warm_bytes, warm_s = job.bytes_read, job.seconds
        while not job.finished:
            job.step()
        job.cancel()
        nbytes, seconds = job.bytes_read - warm_bytes, job.seconds - warm_s
        if nbytes <= 0:  # a chat of one blob: its one timing is all there is
            nbytes, seconds = warm_bytes, warm_s
        if nbytes:
            self.rates.record_restore(nbytes, seconds)
        return bool(nbytes)

    def step(self, more: Callable[[], bool]) -> bool:
        """Begin or go on restoring: blobs are read while `more()` says no request waits, for at
        most PROGRESS_EVERY_S (then the caller says how far it got and calls again). True when
        something changed."""
        measured = self.measure()
        if self.start():
            return True  # said before the first blob: the mark shows "restoring" at once
        r = self.running
        if r is None:
            return measured  # a new estimate to show
        until = time.monotonic() + PROGRESS_EVERY_S
        while not r.job.finished and more():
            if self._memory_short(r):
                return True
            r.job.step()
            if time.monotonic() >= until:
                break
        if r.job.finished:
            self._install(r)
        return True

    def _memory_short(self, r: _Running) -> bool:
        left = r.memory_bytes * (1 - r.job.done_tokens / max(1, r.job.n_tokens))
        free, margin = free_for_model(self.loaded, self.sessions.kv_bytes(), self.settings.memory_budget_bytes)
        if free >= left + margin:
            return False
        self.held_back[r.conversation_id] = "memory became short while it was being read back"
        self._cancel()
        return True

    def before_turn(self, conversation_id: str) -> None:
        """A turn needs the thread: a restore of its own conversation is finished now (the turn
        would read the same blobs), one of another conversation is cancelled."""
        r = self.running
        if r is None:
            return
        if r.conversation_id != conversation_id:
            self._cancel()
            return
        before = r.job.seconds
        r.job.run()
        r.turn_s = r.job.seconds - before
        self._install(r)

    def take(self, conversation_id: str) -> RestoredAhead | None:
        """What was restored for this conversation since its last turn (once: its turn takes it)."""
        return self._done.pop(conversation_id, None)

    def forget(self, conversation_id: str) -> None:
        """The conversation was deleted: nothing of it is restored any more."""
        self._done.pop(conversation_id, None)
        self.held_back.pop(conversation_id, None)
        if self._wanted == conversation_id:
            self._wanted = None
        if self.running is not None and self.running.conversation_id == conversation_id:
            self._cancel()

    # ------------------------------------------------------------ endings

    def _install(self, r: _Running) -> None:
        """The running restore `r` finished: its session holds the KV read back (unless a turn filled it)."""
        self.running = None
        if self._wanted == r.conversation_id:
            self._wanted = None
        got = r.job.result()
        if got.bytes_read:
            self.rates.record_restore(got.bytes_read, got.seconds)
        if got.cache is not None:
            session = self.sessions.open(r.conversation_id)
            if session.cache is None:  # a turn may have filled it meanwhile: never replace newer KV
                reply_start = got.state.get("reply_start")  # None from a row spilled before versions
                session.hold(got.ids, got.pictures, got.cache, int(got.state.get("rope_delta", 0)), reply_start)
                session.touch()  # just restored: not idle, so not spilled straight back
                self._done[r.conversation_id] = RestoredAhead(len(got.ids), got.seconds - r.turn_s, r.turn_s)

    def _cancel(self) -> None:
        r, self.running = self.running, None
        if r is not None:
            r.job.cancel()

    def close(self) -> None:
        self._cancel()
        self.open_cid = self._wanted = None
