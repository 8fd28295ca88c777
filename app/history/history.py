"""Conversations on disk: one SQLite database (WAL) plus the content-addressed picture store.

Layout under the data dir:
    history.sqlite3             conversations, messages, full-text index
    pictures/ab/abcdef….png     pictures, named by BLAKE3 of their bytes (engine/pictures/store.py,
                                shared with the API; a message's picture ref is the file's name)

Versions: an edit or a regenerate adds a version of that message beside the old one (same
parent, same role); the turns that followed each version stay with it. A conversation is a tree
of messages (`parent`: the message each one follows) and what is shown is one path through it,
from the first message to `conversations.leaf`. `messages()` is that path; `versions()` says
where each message on it stands among its siblings; `show_version()` switches the path.

Durability: every finished message is committed with synchronous=FULL (survives power loss);
the text of a reply still streaming is rewritten now and then with synchronous=NORMAL, which in
WAL mode survives the process dying. A reply row is created as `interrupted` before its first
token and flipped to `complete` at the end, so a stop or a crash leaves the partial text behind.

No Qt here: the UI calls this from its own thread; a lock makes it safe from any thread.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from engine.pictures import parts
from engine.pictures.ref import PictureRef
from engine.pictures.store import NAME_RE, PictureStore, check_name
from engine.platform.files import is_temp_name
from engine.platform.paths import create_data_dir, private_dir

from .history_db import create_schema, open_database

COMPLETE = "complete"
INTERRUPTED = "interrupted"
DEFAULT_TITLE = "New chat"


@dataclass(frozen=True)
class Conversation:
    id: str
    title: str
    created: float
    updated: float
    system_prompt: str | None = None
    deleted: float | None = None


@dataclass(frozen=True)
class StoredPicture:
    """A message's picture as the history keeps it: the stored file, named by the BLAKE3 digest of
    its bytes (engine/pictures/store.py), for a page or frame a fragment (engine/pictures/parts.py),
    and the name of the file the person attached ("" : none, as for a pasted picture). A page's or
    frame's caption says that name ("report.pdf, page 3"), in the chat and to the model.
    Made from a message's ref string with `parse`, which checks every part."""

    digest: str  # 64 hex: the stored file's bytes (a page's or frame's: its document's or video's)
    extension: str  # the stored file's (".png", ".pdf"; "" : none)
    fragment: str = ""  # "p=<page>@<dpi>" or "t=<seconds>@<fps>/<max frames>"; "" : the whole picture
    name: str = ""

    @classmethod
    def parse(cls, ref: str, name: str = "") -> StoredPicture:
        """'<digest>.png', or '<digest>.pdf#p=2@144' for a page; ValueError for anything else."""
        if not isinstance(ref, str):
            raise TypeError(f"a picture's ref is text, not {type(ref).__name__}")
        if not isinstance(name, str):
            raise TypeError(f"a picture's file name is text, not {type(name).__name__}")
        base, fragment = parts.split(ref)
        check_name(base)
        parts.check_fragment(fragment)
        digest, dot, ext = base.partition(".")
        return cls(digest, dot + ext, fragment, name)

    @property
    def file(self) -> str:
        """The stored file's name in the picture store."""
        return self.digest + self.extension

    @property
    def ref(self) -> str:
        """As a message row keeps it."""
        return f"{self.file}#{self.fragment}" if self.fragment else self.file


@dataclass(frozen=True)
class StoredMessage:
    id: int
    conversation_id: str
    role: str  # user | assistant | system
    text: str
    pictures: tuple[str, ...]  # picture refs; resolve with History.picture_path
    status: str  # complete | interrupted
    created: float
    edited: float | None = None
    note: str = ""  # a reply's turn line ("Continued 69 tokens from memory · …"), kept across restarts
    names: tuple[str, ...] = ()  # each picture's file name, in `pictures` order ("" or missing: none)
    parent: int | None = None  # the message it follows (None: the first); its siblings are its versions

    def named_pictures(self) -> list[StoredPicture]:
        names = self.names + ("",) * (len(self.pictures) - len(self.names))  # a damaged list: no names
        return [StoredPicture.parse(r, n) for r, n in zip(self.pictures, names, strict=False)]


@dataclass(frozen=True)
class Versions:
    """A message's versions: it and its siblings (same parent, same role), oldest first."""

    ids: tuple[int, ...]
    shown: int  # index into ids of the one on the shown path

    @property
    def count(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class SearchHit:
    conversation_id: str
    title: str
    message_id: int | None  # None when only the title matched
    snippet: str


class History:
    """The conversation store. Open one per data dir; close() when done."""

    def __init__(self, data_dir: Path | str, busy_timeout_s: float = 5.0):
        self.data_dir = create_data_dir(data_dir)
        self.pictures_dir = private_dir(self.data_dir / "pictures")
        self.pictures = PictureStore(self.pictures_dir)  # shared with the API (engine/pictures/store.py)
        self.db_path = self.data_dir / "history.sqlite3"
        self._lock = threading.RLock()
        self._last_stamp = 0.0
        self._fts = True
        # a damaged database is set aside and replaced; `recovery` says so (None when all was well)
        self._db, self.recovery = open_database(self.db_path, int(busy_timeout_s * 1000), self._setup)

    def _setup(self, db: sqlite3.Connection) -> None:
        self._fts = create_schema(db)

    # ------------------------------------------------------------ plumbing

    class _Tx:
        """One write transaction under the lock. Whatever fails (BEGIN on a locked or full
        database, the statements, COMMIT), the lock is released, no transaction stays open
        and synchronous is back to NORMAL."""

        def __init__(self, history: History, durable: bool):
            self.h, self.durable = history, durable

        def __enter__(self):
            self.h._lock.acquire()
            try:
                if self.durable:
                    self.h._db.execute("PRAGMA synchronous=FULL")
                self.h._db.execute("BEGIN IMMEDIATE")
            except BaseException:
                self._end()
                raise
            return self.h._db

        def __exit__(self, exc_type, exc, tb):
            db = self.h._db
            try:
                if exc_type is None:
                    db.execute("COMMIT")
            finally:
                try:
                    if db.in_transaction:  # after an error, or a COMMIT that failed
                        db.execute("ROLLBACK")
                finally:
                    self._end()
            return False

        def _end(self) -> None:
            try:
                if self.durable:
                    self.h._db.execute("PRAGMA synchronous=NORMAL")
            finally:
                self.h._lock.release()

    def _now(self) -> float:
        """Wall time, strictly after the last stamp this History gave: chats keep the order their
        activity happened in where the clock ticks coarsely (about 16 ms on Windows)."""
        with self._lock:
            self._last_stamp = max(time.time(), self._last_stamp + 1e-6)
            return self._last_stamp

    def _tx(self, durable: bool = False) -> History._Tx:
        return History._Tx(self, durable)

    def _query(self, sql: str, args: Iterable = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, tuple(args)).fetchall()

    def close(self) -> None:
        with self._lock:
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:
                pass
            self._db.close()

    # ------------------------------------------------------------ conversations

    def create_conversation(self, title: str = DEFAULT_TITLE, system_prompt: str | None = None) -> Conversation:
        now = self._now()
        conv = Conversation(uuid.uuid4().hex, title, now, now, system_prompt)
        with self._tx(durable=True) as db:
            db.execute(
                "INSERT INTO conversations(id, title, created, updated, system_prompt) VALUES (?, ?, ?, ?, ?)",
                (conv.id, title, now, now, system_prompt),
            )
        return conv

    def list_conversations(self, include_deleted: bool = False) -> list[Conversation]:
        where = "" if include_deleted else "WHERE deleted IS NULL"
        rows = self._query(f"SELECT * FROM conversations {where} ORDER BY updated DESC, created DESC")
        return [_conversation(r) for r in rows]

    def get_conversation(self, conversation_id: str) -> Conversation | None:
        rows = self._query("SELECT * FROM conversations WHERE id = ?", (conversation_id,))
        return _conversation(rows[0]) if rows else None

    def rename(self, conversation_id: str, title: str) -> None:
        with self._tx(durable=True) as db:
            db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def set_system_prompt(self, conversation_id: str, prompt: str | None) -> None:
        with self._tx(durable=True) as db:
            db.execute("UPDATE conversations SET system_prompt = ? WHERE id = ?", (prompt, conversation_id))

    def delete_conversation(self, conversation_id: str) -> None:
        """Soft delete: hidden from lists and search until restore() or purge_deleted()."""
        with self._tx(durable=True) as db:
            db.execute("UPDATE conversations SET deleted = ? WHERE id = ?", (self._now(), conversation_id))

    def restore_conversation(self, conversation_id: str) -> None:
        with self._tx(durable=True) as db:
            db.execute("UPDATE conversations SET deleted = NULL WHERE id = ?", (conversation_id,))

    def purge_deleted(self, before: float | None = None) -> list[str]:
        """Really remove soft-deleted conversations (deleted before `before`, default: all)."""
        cutoff = self._now() if before is None else before
        with self._tx(durable=True) as db:
            ids = [
                r[0]
                for r in db.execute(
                    "SELECT id FROM conversations WHERE deleted IS NOT NULL AND deleted <= ?", (cutoff,)
                )
            ]
            for cid in ids:
                db.execute("DELETE FROM messages WHERE conversation = ?", (cid,))
                db.execute("DELETE FROM conversations WHERE id = ?", (cid,))
        return ids

    # ------------------------------------------------------------ messages

    def messages(self, conversation_id: str) -> list[StoredMessage]:
        """The shown version of the conversation, first message first."""
        with self._lock:
            return [_message(r) for r in self._path(self._db, conversation_id)]

    def every_message(self, conversation_id: str) -> list[StoredMessage]:
        """Every version of every message of the conversation, oldest first (`parent` links them)."""
        rows = self._query("SELECT * FROM messages WHERE conversation = ? ORDER BY id", (conversation_id,))
        return [_message(r) for r in rows]

    def versions(self, conversation_id: str) -> dict[int, Versions]:
        """For each message on the shown path that has more than one version: its versions."""
        with self._lock:
            path = self._path(self._db, conversation_id)
            rows = self._db.execute(
                "SELECT id, parent, role FROM messages WHERE conversation = ? ORDER BY id", (conversation_id,)
            ).fetchall()
        siblings: dict[tuple[int | None, str], list[int]] = {}
        for r in rows:
            siblings.setdefault((r["parent"], r["role"]), []).append(r["id"])
        out = {}
        for r in path:
            ids = siblings.get((r["parent"], r["role"]), [r["id"]])
            if len(ids) > 1:
                out[r["id"]] = Versions(tuple(ids), ids.index(r["id"]))
        return out

    def show_version(self, message_id: int) -> None:
        """Show the version of the conversation that holds this message: it, what it follows, and
        after it the turns that followed it (at each step the newest), as they were left."""
        with self._tx(durable=True) as db:
            row = db.execute("SELECT conversation FROM messages WHERE id = ?", (message_id,)).fetchone()
            if row is None:
                raise KeyError(message_id)
            leaf = message_id
            while child := db.execute("SELECT MAX(id) FROM messages WHERE parent = ?", (leaf,)).fetchone()[0]:
                leaf = child
            db.execute("UPDATE conversations SET leaf = ? WHERE id = ?", (leaf, row["conversation"]))

    def show_until(self, message_id: int) -> None:
        """Show the conversation up to this message: the next message added follows it (and the
        ones that followed it so far stay, as another version)."""
        with self._tx(durable=True) as db:
            db.execute(
                "UPDATE conversations SET leaf = ? WHERE id = (SELECT conversation FROM messages WHERE id = ?)",
                (message_id, message_id),
            )

    @staticmethod
    def _path(db: sqlite3.Connection, conversation_id: str) -> list[sqlite3.Row]:
        """The shown path: from the leaf (or, without one, the newest message) up its parents."""
        rows = {r["id"]: r for r in db.execute("SELECT * FROM messages WHERE conversation = ?", (conversation_id,))}
        if not rows:
            return []
        conv = db.execute("SELECT leaf FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        at = conv["leaf"] if conv is not None and conv["leaf"] in rows else max(rows)
        path: list[sqlite3.Row] = []
        seen: set[int] = set()
        while at in rows and at not in seen:  # a parent that is gone (salvaged history) ends the path
            seen.add(at)
            path.append(rows[at])
            at = rows[at]["parent"]
        return path[::-1]

    def _leaf(self, db: sqlite3.Connection, conversation_id: str) -> int | None:
        path = self._path(db, conversation_id)
        return path[-1]["id"] if path else None

    def get_message(self, message_id: int) -> StoredMessage | None:
        rows = self._query("SELECT * FROM messages WHERE id = ?", (message_id,))
        return _message(rows[0]) if rows else None

    def add_message(
        self,
        conversation_id: str,
        role: str,
        text: str,
        pictures: Iterable[str | StoredPicture] = (),
        status: str = COMPLETE,
    ) -> StoredMessage:
        """`pictures`: StoredPictures, or bare refs (pictures without a file name)."""
        refs, names = self._checked_pictures(pictures)
        now = self._now()
        with self._tx(durable=status == COMPLETE) as db:
            parent = self._leaf(db, conversation_id)
            cur = db.execute(
                "INSERT INTO messages(conversation, role, text, pictures, status, created, picture_names, parent)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, role, text, json.dumps(list(refs)), status, now, json.dumps(list(names)), parent),
            )
            db.execute(
                "UPDATE conversations SET updated = ?, leaf = ? WHERE id = ?", (now, cur.lastrowid, conversation_id)
            )
        return StoredMessage(cur.lastrowid, conversation_id, role, text, refs, status, now, names=names)

    def begin_reply(self, conversation_id: str) -> StoredMessage:
        """An assistant row that reads as `interrupted` until finish_reply() says otherwise."""
        return self.add_message(conversation_id, "assistant", "", status=INTERRUPTED)

    def update_reply(self, message_id: int, text: str) -> None:
        """Save the partial text of a streaming reply (cheap: no fsync)."""
        with self._tx() as db:
            db.execute("UPDATE messages SET text = ? WHERE id = ? AND text != ?", (text, message_id, text))

    def finish_reply(self, message_id: int, text: str, stopped: bool = False, note: str = "") -> None:
        """The reply's final text and status, and its turn line (`note`, app/memory/turn_line.py)."""
        status = INTERRUPTED if stopped else COMPLETE
        now = self._now()
        with self._tx(durable=True) as db:
            db.execute(
                "UPDATE messages SET text = ?, status = ?, note = ? WHERE id = ?", (text, status, note, message_id)
            )
            db.execute(
                "UPDATE conversations SET updated = ? WHERE id = (SELECT conversation FROM messages WHERE id = ?)",
                (now, message_id),
            )

    def add_version(
        self, message_id: int, text: str, pictures: Iterable[str | StoredPicture] | None = None
    ) -> StoredMessage:
        """A new version of a message (an edit), beside it and shown from now on; the old one keeps
        the turns that followed it. `pictures` None: the old version's, with their names."""
        now = self._now()
        with self._tx(durable=True) as db:
            row = db.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
            if row is None:
                raise KeyError(message_id)
            refs, names = self._checked_pictures(_message(row).named_pictures() if pictures is None else pictures)
            cur = db.execute(
                "INSERT INTO messages(conversation, role, text, pictures, status, created, edited, picture_names,"
                " parent) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row["conversation"],
                    row["role"],
                    text,
                    json.dumps(list(refs)),
                    COMPLETE,
                    now,
                    now,
                    json.dumps(list(names)),
                    row["parent"],
                ),
            )
            db.execute(
                "UPDATE conversations SET updated = ?, leaf = ? WHERE id = ?",
                (now, cur.lastrowid, row["conversation"]),
            )
        cid, role = row["conversation"], row["role"]
        return StoredMessage(cur.lastrowid, cid, role, text, refs, COMPLETE, now, now, names=names)

    def delete_from(self, message_id: int) -> int:
        """Delete this message and every message that follows it in any version (a reply that
        failed before its first word); the conversation then shows what it followed."""
        with self._tx(durable=True) as db:
            row = db.execute("SELECT conversation, parent FROM messages WHERE id = ?", (message_id,)).fetchone()
            if row is None:
                return 0
            doomed, frontier = [message_id], [message_id]
            while frontier:
                kids = db.execute(
                    f"SELECT id FROM messages WHERE parent IN ({','.join('?' * len(frontier))})", frontier
                ).fetchall()
                frontier = [k[0] for k in kids]
                doomed += frontier
            db.executemany("DELETE FROM messages WHERE id = ?", [(i,) for i in doomed])
            db.execute(
                "UPDATE conversations SET leaf = ? WHERE id = ? AND (leaf IS NULL OR leaf IN ({}))".format(
                    ",".join("?" * len(doomed))
                ),
                (row["parent"], row["conversation"], *doomed),
            )
            return len(doomed)

    # ------------------------------------------------------------ search

    def search(self, query: str, limit: int = 50) -> list[SearchHit]:
        """Conversations whose title or messages contain `query` (case-insensitive)."""
        q = query.strip()
        if not q:
            return []
        hits: list[SearchHit] = []
        seen: set[tuple[str, int | None]] = set()
        like = "%" + q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        for r in self._query(
            "SELECT id, title FROM conversations WHERE deleted IS NULL"
            " AND title LIKE ? ESCAPE '\\' ORDER BY updated DESC LIMIT ?",
            (like, limit),
        ):
            hits.append(SearchHit(r["id"], r["title"], None, r["title"]))
            seen.add((r["id"], None))
        if self._fts and len(q) >= 3:
            phrase = '"' + q.replace('"', '""') + '"'
            rows = self._query(
                "SELECT m.id, m.conversation, m.text, c.title FROM messages_fts f"
                " JOIN messages m ON m.id = f.rowid JOIN conversations c ON c.id = m.conversation"
                " WHERE messages_fts MATCH ? AND c.deleted IS NULL"
                " ORDER BY c.updated DESC, m.id DESC LIMIT ?",
                (phrase, limit),
            )
        else:
            rows = self._query(
                "SELECT m.id, m.conversation, m.text, c.title FROM messages m"
                " JOIN conversations c ON c.id = m.conversation"
                " WHERE m.text LIKE ? ESCAPE '\\' AND c.deleted IS NULL"
                " ORDER BY c.updated DESC, m.id DESC LIMIT ?",
                (like, limit),
            )
        for r in rows:
            hits.append(SearchHit(r["conversation"], r["title"], r["id"], _snippet(r["text"], q)))
        return hits[:limit]

    # ------------------------------------------------------------ pictures

    def add_picture(self, path: Path | str) -> str:
        """Copy a picture into the store (if not there yet); returns its ref."""
        src = Path(path)
        return self.pictures.put(src.read_bytes(), src.suffix)

    def add_picture_bytes(self, data: bytes, extension: str = ".png") -> str:
        """Store picture bytes (checked by the caller) and keep them: the API's size cap never
        removes a picture the history holds. Returns its ref (the stored file's name)."""
        return self.pictures.put(data, extension)

    def add_file(self, path: Path | str, digest: str) -> str:
        """Keep a document or video (checked and hashed by the caller), streamed into the store."""
        return self.pictures.put_file(path, Path(path).suffix, digest)

    def picture_path(self, ref: str) -> Path:
        """The stored file (a page's or frame's: its document's or video's)."""
        return self.pictures.path(parts.split(ref)[0])

    def thumbnail_source(self, ref: str) -> str:
        """What a thumbnail is drawn from: the stored file, and for a page or frame its fragment."""
        base, fragment = parts.split(ref)
        return f"{self.pictures.path(base)}#{fragment}" if fragment else str(self.pictures.path(base))

    def picture_ref(self, picture: str | StoredPicture) -> PictureRef:
        """What the engine is sent, the one place a stored picture becomes a PictureRef: the stored
        file and its digest (from the name, no read); a page or a frame keyed from its file's
        digest the same way, named as the person's file was (its caption says so)."""
        p = picture if isinstance(picture, StoredPicture) else StoredPicture.parse(picture)
        return parts.ref_at(self.pictures.path(p.file), p.digest, p.fragment, p.name)

    def purge_orphan_pictures(self, keep: Iterable[str] = ()) -> int:
        """Remove stored pictures that no message references (nor `keep`, e.g. a draft's).
        Transient pictures (the API's) are the API's to expire: a queued request may need one."""
        used = {parts.split(k)[0] for k in keep}
        for (refs,) in self._query("SELECT pictures FROM messages WHERE pictures != '[]'"):
            used.update(parts.split(r)[0] for r in json.loads(refs))  # a page keeps its document
        removed = 0
        for name, path in list(self.pictures.names()):
            if name in used:
                continue
            if is_temp_name(name) or name.startswith(".tmp"):  # ".tmp-*": older versions' temp files
                path.unlink(missing_ok=True)
            elif NAME_RE.match(name) and not self.pictures.is_transient(name):
                self.pictures.remove(name)
            else:
                continue
            removed += 1
        return removed

    @staticmethod
    def _checked_pictures(pictures: Iterable[str | StoredPicture]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The refs (each checked) and the file names of a message's pictures."""
        given = [p if isinstance(p, StoredPicture) else StoredPicture.parse(p) for p in pictures]
        return tuple(p.ref for p in given), tuple(p.name for p in given)


# ---------------------------------------------------------------- helpers


def _conversation(r: sqlite3.Row) -> Conversation:
    return Conversation(r["id"], r["title"], r["created"], r["updated"], r["system_prompt"], r["deleted"])


def _message(r: sqlite3.Row) -> StoredMessage:
    return StoredMessage(
        r["id"],
        r["conversation"],
        r["role"],
        r["text"],
        tuple(json.loads(r["pictures"])),
        r["status"],
        r["created"],
        r["edited"],
        r["note"],
        _names(r["picture_names"]),
        r["parent"],
    )


def _names(stored: str) -> tuple[str, ...]:
    """A message's picture names as stored; a list that is not one of names (hand-edited, or
    damaged past the schema's checks) reads as no names: its pictures still show, uncaptioned."""
    try:
        names = json.loads(stored)
    except ValueError:
        return ()
    return tuple(names) if isinstance(names, list) and all(isinstance(n, str) for n in names) else ()


def _snippet(text: str, query: str, width: int = 80) -> str:
    """One line of `text` that begins with the word the match is in: the sidebar cuts a
    snippet at its right end, so words shown before the match could push it out of sight."""
    flat = " ".join(text.split())
    m = re.search(re.escape(" ".join(query.split())), flat, re.IGNORECASE)
    if m is None:
        return flat[:width]
    start = flat.rfind(" ", 0, m.start()) + 1
    return ("…" if start else "") + flat[start : start + width] + ("…" if start + width < len(flat) else "")
