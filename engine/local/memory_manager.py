"""Device memory policy for one loaded model: make room before the encoder loads, spill idle
conversations on their timers, release a conversation's hot KV, and the memory report.

The engine owns one per loaded model and calls it between requests; the turn pipeline tells it
which conversation is running, so that one is never spilled or released under its turn, and asks
it to make room before the encoder loads. It calls only downwards (the spill scheduler, the gate).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..device.heap_trim import return_freed_heap
from ..device.ledger import build_report, free_for_model
from ..protocol.events import EncoderStatus, MemoryReport, SpillState, SpillStatus, StoreCounters
from ..vision.gate import PictureGate
from .conversations import Conversations
from .rates import RateBook
from .resume_ahead import ResumeAhead
from .session import Session
from .spill_scheduler import SpillScheduler

log = logging.getLogger(__name__)


def idle_tick_s(settings, busy: bool = False) -> float:
    """How long the owner thread waits for a request before its timers are looked at."""
    if busy:
        return 0.02  # a spill waits for its writer, or a restore goes on between requests: soon
    return min(1.0, max(0.05, settings.elastic_idle_s / 4), max(0.05, settings.spill_idle_s / 4))


def memory_report(
    loaded, sessions: Conversations, gate=None, spill_scheduler: SpillScheduler | None = None
) -> MemoryReport:
    extra = {}
    state, left = EncoderStatus.RESIDENT, None
    counters = {}
    if gate is not None:
        extra["image_cache_ram"], extra["image_cache_disk"] = gate.cache_bytes()
        state, left = gate.encoder_state, gate.encoder_idle_left()
        counters = gate.stats_counters()
    store = None
    if spill_scheduler is not None and spill_scheduler.available:
        store = StoreCounters(**spill_scheduler.counters())
        extra["kv_store_disk"] = store.bytes_on_disk
    report = build_report(loaded, sessions, extra, counters, state, left)
    report.store = store
    report.store_status = spill_scheduler.status if spill_scheduler is not None else ""
    return report


class MemoryManager:
    def __init__(
        self,
        loaded,
        sessions: Conversations,
        spill_scheduler: SpillScheduler,
        gate: PictureGate,
        settings,
        emit: Callable,
        rates: RateBook,
    ):
        self.loaded = loaded
        self.sessions = sessions
        self.spill_scheduler = spill_scheduler
        self.gate = gate
        self.settings = settings
        self.emit = emit
        self.active_cid: str | None = None  # the conversation whose turn is running
        # the chat open in the window, restored from the SSD before its turn
        self.resume = ResumeAhead(loaded, sessions, spill_scheduler, rates, settings)

    def apply_settings(self, settings) -> None:
        self.settings = settings
        self.spill_scheduler.apply_settings(settings)
        self.resume.apply_settings(settings)

    # ------------------------------------------------------------ a turn's conversation

    def turn_started(self, conversation_id: str) -> None:
        self.active_cid = conversation_id

    def turn_ended(self) -> None:
        self.active_cid = None
        return_freed_heap()  # the turn's freed activations (on the CPU) and host buffers

    # ------------------------------------------------------------ freeing memory

    def make_room(self, needed: int) -> None:
        """Before the encoder loads: if the device is short of memory, release hot KV of idle
        conversations, oldest first, never the one whose turn is running."""
        free, margin = free_for_model(self.loaded, self.sessions.kv_bytes(), self.settings.memory_budget_bytes)
        for s in self.sessions.idle_hot(self.active_cid):
            if free >= needed + margin:
                break
            freed = s.kv_bytes()
            self.release_session(s)
            free += freed

    def release_session(self, session: Session) -> None:
        """Free a conversation's hot KV: spilled to SSD first when the store can take it."""
        sp = self.spill_scheduler
        if sp.available and session.cache is not None:
            try:
                if sp.spill_blocking(session):
                    return
            except Exception:
                log.exception("spill before release failed")
        session.drop_kv()

    def spill_now(self, conversation_id: str) -> None:
        """The person asked to spill a conversation: try a full disk again now."""
        self.resume.spilled_by_hand(conversation_id)
        session = self.sessions.get(conversation_id)
        sp = self.spill_scheduler
        if not sp.retry(now=True):
            why = sp.refusal or sp.error or sp.unavailable
            self.emit(SpillState(conversation_id, SpillStatus.REFUSED, why or "the store is unavailable"))
        elif session is None or session.cache is None:
            self.emit(SpillState(conversation_id, SpillStatus.SPILLED, "nothing hot to spill"))
        else:
            sp.spill_blocking(session)

    # ------------------------------------------------------------ timers

    def tick_s(self) -> float:
        busy = self.spill_scheduler.running is not None or self.resume.running is not None
        return idle_tick_s(self.settings, busy=busy)

    def on_idle(self, more: Callable[[], bool]) -> bool:
        """Encoder unload, session spill and the open chat's restore, between requests; True when
        memory changed. `more()` says no request is waiting: a turn is never held up for more
        than one unit's copy or one blob's read."""
        changed = self.gate.unload_if_idle()
        sp = self.spill_scheduler
        if sp.available or sp.unavailable:  # due() retries an unavailable store
            if sp.running is None:
                due = sp.due(self.sessions, {self.active_cid, self.resume.open_cid})
                if due is not None:
                    sp.begin(due)
            if sp.running is not None and sp.step(more=more):
                changed = True
        if sp.running is None and more() and self.resume.step(more):
            changed = True
        return changed

    def close(self) -> None:
        """Exit or model switch: spill what is hot, so nothing is lost."""
        self.resume.close()
        self.spill_scheduler.close(self.sessions)
        self.active_cid = None

    def report(self) -> MemoryReport:
        return memory_report(self.loaded, self.sessions, self.gate, self.spill_scheduler)
