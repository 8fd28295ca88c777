"""Where each chat's memory is, and each picture's encoding, as the window marks them.

The engine says it (ChatMemoryReport, PictureMarks: engine/protocol/events.py); this module keeps
the latest word per conversation and per picture and turns it into the few words a sidebar row
shows and the sentences of its tooltip. Estimates are the engine's, from rates it measured on this
machine; when none was measured yet the words say so instead of guessing.

Marks are shown for the built-in engine only: with a server, its caches are the server's.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QObject, Signal

from engine.protocol.events import ChatMemory, ChatMemoryReport, KVPlace, PictureMarks, PicturePlace

from ..sizes import exact_bytes, human_bytes
from .turn_line import estimate


@dataclass(frozen=True)
class Mark:
    place: KVPlace
    words: str  # a few words for the sidebar row
    tooltip: str  # what it means for the next turn, with the figures


def _resume(chat: ChatMemory) -> str:
    if chat.resume_s is not None and chat.reread_s is not None:
        return f"resumes in {estimate(chat.resume_s)} instead of {estimate(chat.reread_s)} re-reading it"
    if chat.resume_s is not None:
        return f"resumes in {estimate(chat.resume_s)}"
    return "resumes without re-reading it (restore speed not measured yet on this computer)"


def where_words(chat: ChatMemory) -> str:
    """Where a chat's memory is and what that means for its next turn, with the figures: the one
    wording of it, shown as the Memory dock's "This chat" line and a sidebar mark's tooltip."""
    size = human_bytes(chat.kv_bytes)
    if chat.place == KVPlace.HOT:
        return f"in memory: {chat.tokens:,} tokens of KV ({size}); the next turn starts at once"
    if chat.place == KVPlace.SPILLING:
        return f"being saved to the SSD ({size}); it stays in memory until that is done"
    if chat.place == KVPlace.RESTORING:
        return (
            f"restoring from the SSD: {chat.restored_tokens:,} of {chat.tokens:,} tokens read back ({size}); "
            "the next turn starts from them"
        )
    if chat.place == KVPlace.ON_SSD:
        text = f"on the SSD: {chat.tokens:,} tokens of KV ({size}); {_resume(chat)}"
        return text + (f" (not restored ahead: {chat.held_back})" if chat.held_back else "")
    return "not cached: the next turn re-reads the whole conversation"


def where_brief(chat: ChatMemory, hot_bytes: int | None) -> str:
    """The same, in short for a line of the dock's Details; `hot_bytes`: what the engine's memory
    report counts for it in memory (exact), when it has any there."""
    if chat.place == KVPlace.ON_SSD:
        return f"on the SSD ({human_bytes(chat.kv_bytes)})"
    if chat.place == KVPlace.RESTORING:
        return "restoring from the SSD…"
    in_memory = exact_bytes(chat.kv_bytes if hot_bytes is None else hot_bytes)
    if chat.place == KVPlace.SPILLING:
        return f"{in_memory}, being saved to the SSD"
    return in_memory


# the sidebar row's few words for each place
MARK_WORDS = {
    KVPlace.HOT: "in memory",
    KVPlace.SPILLING: "saving to SSD…",
    KVPlace.ON_SSD: "on SSD",
    KVPlace.RESTORING: "restoring…",
    KVPlace.NOT_CACHED: "not cached",
}


def mark_of(chat: ChatMemory) -> Mark:
    words = where_words(chat)
    return Mark(chat.place, MARK_WORDS[chat.place], f"{words[0].upper()}{words[1:]}.")


class ChatMemoryMarks(QObject):
    """The latest ChatMemoryReport, as marks per conversation."""

    changed = Signal()
    chatChanged = Signal(str, object)  # conversation id, its new Mark (tests follow transitions)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.report: ChatMemoryReport | None = None
        self.active = True  # the built-in engine is in use
        self._marks: dict[str, Mark] = {}

    def on_report(self, report: ChatMemoryReport) -> None:
        self.report = report
        old, self._marks = self._marks, {c.conversation_id: mark_of(c) for c in report.chats}
        for cid in set(old) | set(self._marks):
            new = self._marks.get(cid) or mark_of(ChatMemory(cid, KVPlace.NOT_CACHED))
            if old.get(cid) != new:
                self.chatChanged.emit(cid, new)
        self.changed.emit()

    def clear(self) -> None:
        """A model is loading (the old one's KV means nothing to it): no marks until it reports."""
        self.report = None
        self._marks = {}
        self.changed.emit()

    def set_active(self, active: bool) -> None:
        if active != self.active:
            self.active = active
            self.changed.emit()

    def chat(self, conversation_id: str) -> ChatMemory | None:
        """What the engine said of this conversation; None before its first report or with a server."""
        if not self.active or self.report is None or not conversation_id:
            return None
        return self.report.of(conversation_id)

    def mark(self, conversation_id: str) -> Mark | None:
        chat = self.chat(conversation_id)
        if chat is None:
            return None
        return self._marks.get(conversation_id) or mark_of(chat)


PICTURE_WORDS = {
    PicturePlace.RAM: ("cached", "Encoded and cached in memory: it will not wake the vision encoder."),
    PicturePlace.DISK: ("cached", "Encoded and cached on disk: it will not wake the vision encoder."),
    PicturePlace.NOT_CACHED: ("new", "Not encoded yet: the vision encoder reads it on its next turn."),
}


class PictureMarkBook(QObject):
    """Where each picture's encoded features are (picture digest -> PicturePlace)."""

    changed = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.places: dict[str, PicturePlace] = {}
        self.active = True

    def on_marks(self, marks: PictureMarks) -> None:
        self.places.update(marks.places)
        self.changed.emit()

    def clear(self) -> None:
        self.places.clear()
        self.changed.emit()

    def set_active(self, active: bool) -> None:
        if active != self.active:
            self.active = active
            self.changed.emit()

    def place(self, digest: str) -> PicturePlace | None:
        return self.places.get(digest) if self.active else None

    def words(self, digest: str) -> tuple[str, str] | None:
        """(a word for the thumbnail's badge, its tooltip), or None when nothing is known."""
        place = self.place(digest)
        return PICTURE_WORDS[place] if place is not None else None
