"""What happens when the user sends, stops, regenerates, edits or switches versions: history +
engine + the view. An edit or a regenerate adds a version (app/history/history.py) and keeps the
old one with the turns that followed it; the view then shows the new version, and "‹ 2/3 ›" on a
message switches between them. The engine is sent the shown version's messages at the next turn.

Each reply is written to history before its first token (as `interrupted`), its text saved
about once a second while it streams, and flipped to `complete` when the engine says done;
so a stop or a crash leaves what was seen. Several conversations may have a reply queued or
running; each conversation has at most one.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from PySide6.QtCore import QObject, Signal

from engine.pictures.ref import PictureRef
from engine.protocol.events import Message, Turn, TurnDone, TurnFailed

from ..connection import EngineBridge
from ..history import DEFAULT_TITLE, INTERRUPTED, History, StoredMessage, StoredPicture, title_from, unique_title
from ..memory import turn_line
from ..settings import Preferences
from .message_model import MessageItem, MessageListModel

SAVE_INTERVAL_S = 1.0


def fresh_seed() -> int:
    """A new seed for each "More varied" reply, so two of them differ; a test hands ChatController
    its own source to know which seed a reply was sampled with."""
    return random.SystemRandom().getrandbits(63)


@dataclass
class ActiveReply:
    turn_id: int
    conversation_id: str
    message_id: int
    parts: list[str] = field(default_factory=list)
    last_saved: float = 0.0
    discarded: bool = False  # its row was dropped (regenerate / edit while it ran)
    replaced: str | None = None  # a greedy regeneration: the text of the reply it replaced

    def text(self) -> str:
        return "".join(self.parts)


class ChatController(QObject):
    conversationsChanged = Signal()
    currentChanged = Signal(str)  # conversation id, "" for none
    generatingChanged = Signal(bool)  # whether the open conversation has a reply running
    problem = Signal(str)
    note = Signal(str)  # a passing remark for the status bar
    turnFailed = Signal(str)  # conversation id whose turn failed (it can be sent again)
    turnFinished = Signal(object)  # TurnDone

    def __init__(
        self,
        history: History,
        bridge: EngineBridge,
        prefs: Preferences,
        model: MessageListModel,
        parent=None,
        seeds: Callable[[], int] = fresh_seed,
    ):
        super().__init__(parent)
        self.history, self.bridge, self.prefs, self.model = history, bridge, prefs, model
        self.seeds = seeds  # where a "More varied" reply's sampling seed comes from
        self.current_id: str | None = None
        self._active: dict[int, ActiveReply] = {}
        bridge.tokens.connect(self._on_tokens)
        bridge.turnDone.connect(self._on_done)
        bridge.turnFailed.connect(self._on_failed)

    # ------------------------------------------------------------ conversations

    def open_conversation(self, conversation_id: str | None) -> None:
        self.current_id = conversation_id
        items = []
        if conversation_id:
            streaming = {a.message_id: a for a in self._active.values() if not a.discarded}
            versions = self.history.versions(conversation_id)
            for m in self.history.messages(conversation_id):
                if m.role == "system":
                    continue
                item = self._item(m)
                if (v := versions.get(m.id)) is not None:
                    item.versions = (v.shown + 1, v.count)
                if m.id in streaming:
                    item.text, item.streaming = streaming[m.id].text(), True
                items.append(item)
        self.model.set_messages(conversation_id, items)
        self.currentChanged.emit(conversation_id or "")
        self.generatingChanged.emit(self.is_generating())

    def new_conversation(self) -> str:
        """Open an empty conversation (the current one, if it is still empty and untitled)."""
        cur = self.history.get_conversation(self.current_id) if self.current_id else None
        if cur and cur.title == DEFAULT_TITLE and not self.history.messages(cur.id):
            return cur.id
        conv = self.history.create_conversation()
        self.open_conversation(conv.id)
        self.conversationsChanged.emit()
        return conv.id

    def rename(self, conversation_id: str, title: str) -> None:
        title = title.strip()
        if title:
            self.history.rename(conversation_id, title)
            self.conversationsChanged.emit()

    def delete_conversation(self, conversation_id: str) -> None:
        for a in self._active.values():
            if a.conversation_id == conversation_id and not a.discarded:
                self.bridge.stop(a.turn_id)
        self.history.delete_conversation(conversation_id)
        self.bridge.forget(conversation_id)
        if conversation_id == self.current_id:
            rest = self.history.list_conversations()
            self.open_conversation(rest[0].id if rest else None)
        self.conversationsChanged.emit()

    def restore_conversation(self, conversation_id: str) -> None:
        self.history.restore_conversation(conversation_id)
        self.open_conversation(conversation_id)
        self.conversationsChanged.emit()

    # ------------------------------------------------------------ turns

    def is_generating(self, conversation_id: str | None = None) -> bool:
        cid = conversation_id or self.current_id
        return any(a.conversation_id == cid and not a.discarded for a in self._active.values())

    def active_turn(self, conversation_id: str | None = None) -> int | None:
        cid = conversation_id or self.current_id
        for a in self._active.values():
            if a.conversation_id == cid and not a.discarded:
                return a.turn_id
        return None

    def send(self, text: str, picture_refs: list[str | StoredPicture]) -> int | None:
        conv = None if self.current_id is None else self.history.get_conversation(self.current_id)
        if conv is None:
            conv = self.history.create_conversation()
            self.current_id = conv.id
            self.model.set_messages(conv.id, [])
            self.currentChanged.emit(conv.id)
        cid = conv.id
        if self.is_generating(cid):
            return None
        first = not any(m.role == "user" for m in self.history.messages(cid))
        msg = self.history.add_message(cid, "user", text, picture_refs)
        if first and conv.title == DEFAULT_TITLE:
            taken = (c.title for c in self.history.list_conversations() if c.id != cid)
            self.history.rename(cid, unique_title(title_from(text, len(picture_refs)), taken))
        self.model.append(self._item(msg))
        turn_id = self._start_reply(cid)
        self.conversationsChanged.emit()
        return turn_id

    def stop(self) -> None:
        tid = self.active_turn()
        if tid is not None:
            self.bridge.stop(tid)

    def regenerate(self, message_id: int | None = None, varied: bool = False) -> int | None:
        """Ask again for a reply (default: the last one): the new reply is a version beside the
        old, which keeps the turns that followed it (an empty one, from a failed turn, is dropped).
        `varied`: sample this one reply (Settings' temperature and top-p, a seed from `seeds`)
        even when replies are greedy."""
        cid = self.current_id
        if cid is None:
            return None
        msgs = self.history.messages(cid)
        if message_id is None:
            replies = [m for m in msgs if m.role == "assistant"]
            message_id = replies[-1].id if replies and replies[-1] is msgs[-1] else None
        at = next((i for i, m in enumerate(msgs) if m.id == message_id), None)
        old = msgs[at] if at is not None and msgs[at].role == "assistant" else None
        self._discard_active(cid)
        if old is not None:
            if not old.text:
                self.history.delete_from(old.id)
            msgs = msgs[:at]
            if msgs:
                self.history.show_until(msgs[-1].id)
        if not msgs or msgs[-1].role != "user":
            self.open_conversation(cid)
            return None
        sampling = self.prefs.sampling()
        if varied:
            sampling = replace(sampling, greedy=False, seed=self.seeds())
        turn_id = self._start_reply(cid, sampling)
        if sampling.greedy and old is not None:
            self._active[turn_id].replaced = old.text
        self.open_conversation(cid)
        return turn_id

    def edit_and_resend(self, message_id: int, text: str, picture_refs: Sequence[str | StoredPicture]) -> int | None:
        """Send an edited question as a new version of it; the old version keeps what followed it."""
        cid = self.current_id
        old = self.history.get_message(message_id)
        if old is None or old.conversation_id != cid or old.role != "user":
            return None
        self._discard_active(cid)
        self.history.add_version(message_id, text, picture_refs)
        turn_id = self._start_reply(cid)
        self.open_conversation(cid)
        self.conversationsChanged.emit()
        return turn_id

    def switch_version(self, message_id: int, step: int) -> bool:
        """Show the version `step` away (-1: the one before) of a message of the open chat, with
        the turns that followed it there. Not while a reply of this chat is being written: the
        reply belongs to the version shown. True when it switched."""
        cid = self.current_id
        versions = self.history.versions(cid).get(message_id) if cid else None
        if cid is None or versions is None:
            return False
        if self.is_generating(cid):
            self.note.emit("Stop the reply (or let it finish) before switching to another version.")
            return False
        to = versions.shown + step
        if not 0 <= to < versions.count:
            return False
        self.history.show_version(versions.ids[to])
        self.open_conversation(cid)
        return True

    def open_message(self, conversation_id: str, message_id: int) -> None:
        """Open a chat at the version that holds this message (a search hit in an older version)."""
        if self.history.get_message(message_id) is not None and message_id not in {
            m.id for m in self.history.messages(conversation_id)
        }:
            self.history.show_version(message_id)
        self.open_conversation(conversation_id)

    def _discard_active(self, cid: str) -> None:
        for a in self._active.values():
            if a.conversation_id == cid and not a.discarded:
                a.discarded = True
                self.bridge.stop(a.turn_id)

    def _start_reply(self, cid: str, sampling=None) -> int:
        conv = self.history.get_conversation(cid)
        turn = Turn(
            cid,
            self._engine_messages(self.history.messages(cid)),
            sampling=sampling or self.prefs.sampling(),
            system_prompt=(conv.system_prompt if conv else None) or self.prefs.system_prompt() or None,
        )
        reply = self.history.begin_reply(cid)
        turn_id = self.bridge.submit(turn)
        self._active[turn_id] = ActiveReply(turn_id, cid, reply.id, last_saved=time.monotonic())
        if cid == self.current_id:
            self.model.append(MessageItem(reply.id, "assistant", "", status=INTERRUPTED, streaming=True))
            self.generatingChanged.emit(True)
        return turn_id

    def _engine_messages(self, msgs: list[StoredMessage]) -> list[Message]:
        """Stored messages as the engine wants them: empty replies dropped, same-role runs merged
        (a failed turn leaves two user messages in a row; chat templates want alternation)."""
        out: list[Message] = []
        for m in msgs:
            if m.role == "system" or (m.role == "assistant" and not m.text):
                continue
            # digest from the name, no read; named as the person's file was (a page's caption says it)
            images = [self.history.picture_ref(p) for p in m.named_pictures()]
            if out and out[-1].role == m.role:
                out[-1].text = (out[-1].text + "\n\n" + m.text).strip()
                out[-1].images.extend(images)
            else:
                out.append(Message(m.role, m.text, images))
        return out

    # ------------------------------------------------------------ engine events

    def _on_tokens(self, turn_id: int, cid: str, text: str, count: int) -> None:
        a = self._active.get(turn_id)
        if a is None or a.discarded:
            return
        a.parts.append(text)
        if cid == self.current_id:
            self.model.append_text(a.message_id, text)
        now = time.monotonic()
        if now - a.last_saved >= SAVE_INTERVAL_S:
            self.history.update_reply(a.message_id, a.text())
            a.last_saved = now

    def _on_done(self, ev: TurnDone) -> None:
        a = self._active.pop(ev.turn_id, None)
        if a is None or a.discarded:
            return
        text = ev.reply or a.text()
        note = turn_line(ev.stats)
        self.history.finish_reply(a.message_id, text, stopped=ev.stopped, note=note)
        self.model.update(
            a.message_id, text=text, streaming=False, status=INTERRUPTED if ev.stopped else "complete", note=note
        )
        if a.replaced is not None and text == a.replaced and not ev.stopped:
            self.note.emit(
                # short enough for the status bar beside its labels: the cut-off part would be the hint
                "The same reply: replies are greedy (Settings ▸ Replies). More varied samples another."
            )
        self.turnFinished.emit(ev)
        self.conversationsChanged.emit()
        if a.conversation_id == self.current_id:
            self.generatingChanged.emit(self.is_generating())

    def _on_failed(self, ev: TurnFailed) -> None:
        a = self._active.pop(ev.turn_id, None)
        if a is None or a.discarded:
            return
        if a.text():
            self.history.finish_reply(a.message_id, a.text(), stopped=True)
            self.model.update(a.message_id, text=a.text(), streaming=False, status=INTERRUPTED)
        else:
            self.history.delete_from(a.message_id)
            self.model.remove_from(a.message_id)
        self.problem.emit(ev.message)
        self.turnFailed.emit(a.conversation_id)
        if a.conversation_id == self.current_id:
            self.generatingChanged.emit(self.is_generating())

    # ------------------------------------------------------------ helpers

    def _item(self, m: StoredMessage) -> MessageItem:
        return MessageItem(
            m.id, m.role, m.text, status=m.status, edited=m.edited is not None, note=m.note, **self._pictures_shown(m)
        )

    def _pictures_shown(self, m: StoredMessage) -> dict:
        """A message's pictures as the chat shows them: thumbnails, digests (their cached marks) and
        captions ("report.pdf, page 3"; "" for a plain picture), each in the message's order."""
        refs = [self.history.picture_ref(p) for p in m.named_pictures()]
        return {
            "pictures": [self.history.thumbnail_source(r) for r in m.pictures],
            "digests": [r.digest for r in refs],
            "captions": [r.caption or "" for r in refs],
        }

    def engine_pictures(self) -> list[PictureRef]:
        """The open chat's pictures as its turns send them to the engine, each once."""
        refs = {r.digest: r for m in self._engine_messages(self.stored_messages()) for r in m.images}
        return list(refs.values())

    def stored_messages(self) -> list[StoredMessage]:
        """The open conversation's messages as the history holds them."""
        return self.history.messages(self.current_id) if self.current_id else []

    def message(self, message_id: int) -> StoredMessage | None:
        return self.history.get_message(message_id)

    def shutdown(self) -> None:
        """Save what is streaming (as interrupted) before the engine goes away."""
        for a in list(self._active.values()):
            if not a.discarded:
                self.history.finish_reply(a.message_id, a.text(), stopped=True)
        self._active.clear()
