"""A chat written out for a person and for other programs: Markdown with its pictures in a folder
beside it, and JSON. No Qt: the window's chat menu (app/chat/chat_export.py) and
`main.py export CHAT --to DIR` both call `export_chat`.

In the folder DIR:
    <title>.md         the conversation to read (pictures linked into the folder below)
    <title>.json       every message of every version, with its times, status, turn line and
                       pictures; `parent` links a message to the one it follows and `shown`
                       marks the version the chat shows (the Markdown's)
    <title>/           the pictures: each one once, numbered in order of first appearance; a PDF
                       page or video frame as a PNG of what the model was given (the page drawn at
                       the dpi it was sent at, the frame decoded at its time)
An existing export is never overwritten: the next free name "<title> (2)" is taken instead.
Names are safe on Windows too (no reserved names or characters, no trailing dot or space, short).
A picture whose stored file is gone or no longer matches its digest is named in both files and
listed in `ExportedChat.missing`; it never stops the export of the rest.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

from engine.pictures.document import PageRef
from engine.pictures.file import PictureError
from engine.pictures.video import FrameRef
from engine.platform.files import atomic_write

from .history import INTERRUPTED, Conversation, History, StoredMessage, StoredPicture

FORMAT = "parley-chat"
FORMAT_VERSION = 1
NAME_LIMIT = 80  # characters of a file name made from a title or a picture's name (Windows paths stay short)
_WINDOWS_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(10)), *(f"LPT{i}" for i in range(10))}
_UNSAFE = re.compile(r'[<>:"/\\|?*\x00-\x1f\x7f]')


class ExportError(Exception):
    """The chat cannot be exported as asked; the message is the one line to show."""


@dataclass(frozen=True)
class ExportedChat:
    markdown: Path
    json: Path
    folder: Path | None  # the pictures' folder; None when the chat has no pictures
    pictures: int  # picture files written
    missing: tuple[str, ...]  # pictures not written: their stored file is gone or damaged


@dataclass(frozen=True)
class _Picture:
    """One stored picture as the export writes it."""

    stored: StoredPicture
    kind: str  # picture | page | frame
    caption: str  # what the chat shows under it
    file: str | None  # relative to the export folder ("<title>/01 cat.png"); None: missing


def safe_name(text: str, fallback: str = "Chat", limit: int = NAME_LIMIT) -> str:
    """`text` as a file name that Windows, macOS and Linux all accept: reserved characters and
    control characters become spaces, whitespace is folded, trailing dots and spaces go, reserved
    device names (CON, COM1, …) get an underscore, and the result is at most `limit` characters."""
    flat = _UNSAFE.sub(" ", unicodedata.normalize("NFC", text))
    flat = " ".join(flat.split())[:limit].rstrip(" .")
    if not flat or set(flat) <= {"."}:
        return fallback
    if flat.split(".")[0].upper() in _WINDOWS_RESERVED:
        flat = "_" + flat
    return flat


def open_history(data_dir: Path) -> History:
    """The history in `data_dir` for reading out; a folder without one is not made into one."""
    if not (Path(data_dir) / "history.sqlite3").is_file():
        raise ExportError(f"No chats are kept in {data_dir} (it has no history).")
    return History(data_dir)


def chat_list(history: History) -> list[str]:
    """One line a chat, newest first: the start of its id, when it last changed, its title."""
    return [f"{c.id[:8]}  {_when(c.updated)}  {_one_line(c.title)}" for c in history.list_conversations()]


def find_chat(history: History, query: str) -> Conversation:
    """The chat `query` names: its id, a unique start of its id (6 characters at least), or its
    title (case-insensitive). Deleted chats are not found. ExportError names what went wrong."""
    chats = history.list_conversations()
    for c in chats:
        if c.id == query:
            return c
    found = [c for c in chats if len(query) >= 6 and c.id.startswith(query)]
    if not found:
        wanted = " ".join(query.split()).casefold()
        found = [c for c in chats if " ".join(c.title.split()).casefold() == wanted]
    if len(found) == 1:
        return found[0]
    if not found:
        raise ExportError(f"No chat is called “{query}” or has that id ({len(chats)} chats in this data folder).")
    ids = ", ".join(c.id[:8] for c in found[:5])
    raise ExportError(f"{len(found)} chats are called “{query}”; name one by its id ({ids}).")


def export_chat(history: History, conversation_id: str, to: Path | str) -> ExportedChat:
    """Write the chat into folder `to` (made when missing) as described above."""
    chat = history.get_conversation(conversation_id)
    if chat is None or chat.deleted is not None:
        raise ExportError("That chat is gone (deleted), so it was not exported.")
    to = Path(to).expanduser()
    try:
        to.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ExportError(f"Could not make the folder {to}: {e.strerror or e}.") from e
    messages = history.messages(conversation_id)  # the version shown
    everything = history.every_message(conversation_id)
    base = _free_name(to, safe_name(chat.title))
    folder = to / base
    pictures: dict[str, _Picture] = {}  # by ref: a picture sent again is written once
    missing: list[str] = []
    try:
        for message in messages + everything:  # numbered in the shown version's order first
            for stored in message.named_pictures():
                if stored.ref not in pictures:
                    pictures[stored.ref] = _write_picture(history, stored, folder, base, len(pictures) + 1, missing)
        shown = {m.id for m in messages}
        atomic_write(to / f"{base}.json", _json(chat, everything, shown, pictures).encode("utf-8"))
        others = len(everything) - len(messages)
        atomic_write(to / f"{base}.md", _markdown(chat, messages, others, pictures).encode("utf-8"))
    except OSError as e:
        raise ExportError(f"Could not write the export into {to}: {e.strerror or e}.") from e
    written = sum(1 for p in pictures.values() if p.file)
    return ExportedChat(to / f"{base}.md", to / f"{base}.json", folder if written else None, written, tuple(missing))


def _free_name(to: Path, base: str) -> str:
    """`base`, or `base (2)`, `base (3)`, … : the first for which no .md, .json or folder exists."""
    n = 1
    while True:
        name = base if n == 1 else f"{base} ({n})"
        if not any((to / f).exists() for f in (f"{name}.md", f"{name}.json", name)):
            return name
        n += 1


def _write_picture(
    history: History, stored: StoredPicture, folder: Path, base: str, number: int, missing: list[str]
) -> _Picture:
    ref = history.picture_ref(stored)
    kind = "page" if isinstance(ref, PageRef) else "frame" if isinstance(ref, FrameRef) else "picture"
    caption = ref.caption or stored.name or f"Picture {number}"
    # a page or frame is a PNG of it; a plain picture keeps its own bytes and extension
    extension = ".png" if kind != "picture" else (stored.extension or ".png")
    stem = safe_name(Path(stored.name).stem if kind == "picture" else caption, fallback="picture", limit=60)
    name = f"{number:02d} {stem}{extension}"
    try:
        data = ref.read_checked()
    except (PictureError, OSError, ValueError) as e:
        missing.append(f"{caption}: {e}")
        return _Picture(stored, kind, caption, None)
    atomic_write(folder / name, data)
    return _Picture(stored, kind, caption, f"{base}/{name}")


def _when(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")


def _json(chat: Conversation, messages: list[StoredMessage], shown: set[int], pictures: dict[str, _Picture]) -> str:
    def picture(p: _Picture) -> dict:
        return {
            "file": p.file,  # null: not written (missing or damaged)
            "kind": p.kind,
            "caption": p.caption,
            "name": p.stored.name,
            "ref": p.stored.ref,  # as the history keeps it: the stored file's digest (+ which page or frame)
        }

    doc = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "exported": datetime.now(UTC).isoformat(timespec="seconds"),
        "chat": {
            "id": chat.id,
            "title": chat.title,
            "created": _when(chat.created),
            "updated": _when(chat.updated),
            "instructions": chat.system_prompt,
        },
        "messages": [
            {
                "id": m.id,
                "parent": m.parent,
                "shown": m.id in shown,
                "role": m.role,
                "text": m.text,
                "complete": m.status != INTERRUPTED,
                "created": _when(m.created),
                "edited": _when(m.edited),
                "turn": m.note or None,
                "pictures": [picture(pictures[s.ref]) for s in m.named_pictures()],
            }
            for m in messages
        ],
    }
    return json.dumps(doc, ensure_ascii=False, indent=2) + "\n"


def _markdown(chat: Conversation, messages: list[StoredMessage], others: int, pictures: dict[str, _Picture]) -> str:
    out = [f"# {_one_line(chat.title)}", "", f"*Exported from Parley · {_when(chat.updated)}*", ""]
    if others:
        out += [
            f"*The version of the chat shown in Parley; {others} more messages of its other versions are in the JSON.*",
            "",
        ]
    if chat.system_prompt:
        out += ["> **Instructions:** " + _one_line(chat.system_prompt), ""]
    for m in messages:
        who = {"user": "You", "assistant": "Assistant"}.get(m.role, m.role.capitalize())
        out += [f"## {who}", ""]
        for stored in m.named_pictures():
            p = pictures[stored.ref]
            alt = _one_line(p.caption).replace("[", "(").replace("]", ")")
            if p.file:
                out += [f"![{alt}]({quote(p.file)})", ""]
            else:
                out += [f"*({alt}: not exported, its stored file is gone or damaged)*", ""]
        if m.text:
            out += [m.text.rstrip(), ""]
        if m.role == "assistant" and m.status == INTERRUPTED:
            out += ["*(stopped before the end)*", ""]
    return "\n".join(out)


def _one_line(text: str) -> str:
    return " ".join(text.split())
