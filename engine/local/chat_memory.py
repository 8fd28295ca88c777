"""Where each conversation's KV is, for the window's marks: in memory, being spilled, on the SSD
(with the measured resume and re-read estimates), being restored ahead, or nowhere.

The report is built from the parts that own each fact (the sessions, the spill scheduler and its
store's listing, the resume-ahead job, the measured rates) and sent only when it changed, so a
caller may publish after anything that might have moved a conversation.
"""

from __future__ import annotations

from collections.abc import Callable

from ..kvstore import is_version
from ..protocol.events import ChatMemory, ChatMemoryReport, KVPlace
from .conversations import Conversations
from .rates import RateBook
from .resume_ahead import ResumeAhead
from .spill_scheduler import SpillScheduler


def chat_memory_report(
    sessions: Conversations, spill_scheduler: SpillScheduler, resume: ResumeAhead, rates: RateBook
) -> ChatMemoryReport:
    measured = rates.rates()
    chats: dict[str, ChatMemory] = {}
    spilling = spill_scheduler.running.session.conversation_id if spill_scheduler.running is not None else None
    for cid, s in sessions.items():
        if s.cache is not None:
            chats[cid] = ChatMemory(
                cid,
                KVPlace.SPILLING if cid == spilling else KVPlace.HOT,
                s.cached_tokens,
                s.kv_bytes(),
                reread_s=measured.prefill_s(s.cached_tokens),
            )
    store = spill_scheduler.store
    for stored in store.stored_sessions() if store is not None else ():
        cid = stored.id
        if cid in chats or is_version(cid):  # a version left is not a chat of its own
            continue
        progress = resume.progress(cid)
        if progress is not None:
            chats[cid] = ChatMemory(
                cid, KVPlace.RESTORING, stored.n_tokens, stored.memory_bytes(), restored_tokens=progress[0]
            )
        else:
            chats[cid] = ChatMemory(
                cid,
                KVPlace.ON_SSD,
                stored.n_tokens,
                stored.disk_bytes,
                resume_s=measured.restore_s(stored.disk_bytes),
                reread_s=measured.prefill_s(stored.n_tokens),
                held_back=resume.held_back.get(cid, ""),
            )
    return ChatMemoryReport(list(chats.values()), measured)


class ChatMemoryBoard:
    """Sends a ChatMemoryReport whenever it differs from the last one sent."""

    def __init__(
        self,
        sessions: Conversations,
        spill_scheduler: SpillScheduler,
        resume: ResumeAhead,
        rates: RateBook,
        emit: Callable,
    ):
        self.sessions = sessions
        self.spill_scheduler = spill_scheduler
        self.resume = resume
        self.rates = rates
        self.emit = emit
        self._last: ChatMemoryReport | None = None

    def publish(self, again: bool = False) -> None:
        """Say where each conversation's KV is, if that changed (`again`: even if it did not, for a
        listener that asked)."""
        report = chat_memory_report(self.sessions, self.spill_scheduler, self.resume, self.rates)
        if again or report != self._last:
            self._last = report
            self.emit(report)
