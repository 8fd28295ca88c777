"""Opening the history database: its schema, a private file, and a damaged one set aside instead of a crash.

A database SQLite calls corrupt or "not a database" (or that fails its quick check) is moved to
`history.sqlite3.damaged` (one copy: a later damage replaces the earlier copy), whatever rows
can still be read from it are copied into a fresh database, and the caller gets a
`HistoryRecovery` to tell the person. Errors that are not damage (locked, disk full, read-only)
raise HistoryUnavailable, one line that says which: treating those as damage would throw a good
history away.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.platform.files import sqlite_durable
from engine.platform.paths import private_file

log = logging.getLogger(__name__)

SCHEMA_VERSION = 4
# 2: messages.note, a reply's turn line kept across restarts
# 3: messages.picture_names, the name of the file each picture came from (a page's caption says it)
# 4: versions: messages.parent (the message it follows; NULL: the first) makes a conversation a
#    tree whose branches are its versions; conversations.leaf is the last message shown (NULL: newest)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id            TEXT PRIMARY KEY,
    title         TEXT NOT NULL,
    created       REAL NOT NULL,
    updated       REAL NOT NULL,
    system_prompt TEXT,
    deleted       REAL,
    leaf          INTEGER
);
CREATE TABLE IF NOT EXISTS messages (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role         TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'system')),
    text         TEXT NOT NULL,
    pictures     TEXT NOT NULL DEFAULT '[]',
    status       TEXT NOT NULL CHECK (status IN ('complete', 'interrupted')),
    created      REAL NOT NULL,
    edited       REAL,
    note         TEXT NOT NULL DEFAULT '',
    picture_names TEXT NOT NULL DEFAULT '[]',
    parent       INTEGER
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation, id);
CREATE INDEX IF NOT EXISTS conversations_by_updated ON conversations(updated);
"""
# A message before schema 4 follows the one written before it in its conversation: one version.
_LINEAR_PARENTS = """
UPDATE messages SET parent = (
    SELECT MAX(p.id) FROM messages AS p WHERE p.conversation = messages.conversation AND p.id < messages.id
) WHERE parent IS NULL;
"""

# Trigram FTS gives substring search ("cat" finds "concatenate"); shorter queries fall back to LIKE.
_FTS_SCHEMA = """
CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts
    USING fts5(text, content='messages', content_rowid='id', tokenize='trigram');
CREATE TRIGGER IF NOT EXISTS messages_ai AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, text) VALUES (new.id, new.text);
END;
CREATE TRIGGER IF NOT EXISTS messages_ad AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, text) VALUES ('delete', old.id, old.text);
END;
CREATE TRIGGER IF NOT EXISTS messages_au AFTER UPDATE OF text ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, text) VALUES ('delete', old.id, old.text);
    INSERT INTO messages_fts(rowid, text) VALUES (new.id, new.text);
END;
"""


def create_schema(db: sqlite3.Connection) -> bool:
    """Tables, indexes and (where SQLite has it) the full-text index; True when search can use FTS."""
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA foreign_keys=ON")
    # executescript manages its own transaction, so each script carries BEGIN/COMMIT.
    # A database an older Parley wrote gains the newer columns in the same transaction;
    # `user_version` only ever rises (a newer Parley's database is left as it is).
    version = db.execute("PRAGMA user_version").fetchone()[0]
    db.executescript(
        "BEGIN;" + _SCHEMA + _migrations(db) + f"PRAGMA user_version={max(version, SCHEMA_VERSION)};COMMIT;"
    )
    try:
        db.executescript("BEGIN;" + _FTS_SCHEMA + "COMMIT;")
    except sqlite3.OperationalError:  # SQLite built without FTS5 or its trigram tokenizer
        if db.in_transaction:
            db.execute("ROLLBACK")
        return False
    return True


def _migrations(db: sqlite3.Connection) -> str:
    """The statements that bring an existing database's tables up to `_SCHEMA`: columns added
    with a default, so every row an older version wrote reads as before."""
    columns = {r[1] for r in db.execute("PRAGMA table_info(messages)")}
    if not columns:  # a new database: CREATE TABLE has them all
        return ""
    added = {
        "note": "ALTER TABLE messages ADD COLUMN note TEXT NOT NULL DEFAULT '';",
        "picture_names": "ALTER TABLE messages ADD COLUMN picture_names TEXT NOT NULL DEFAULT '[]';",
        "parent": "ALTER TABLE messages ADD COLUMN parent INTEGER;" + _LINEAR_PARENTS,
    }
    sql = "".join(sql for column, sql in added.items() if column not in columns)
    if "leaf" not in {r[1] for r in db.execute("PRAGMA table_info(conversations)")}:
        sql += "ALTER TABLE conversations ADD COLUMN leaf INTEGER;"
    return sql


DAMAGED_SUFFIX = ".damaged"
_DAMAGE_CODES = {11, 26}  # SQLITE_CORRUPT, SQLITE_NOTADB (primary codes)
_SQLITE_FULL = 13


@dataclass(frozen=True)
class HistoryRecovery:
    reason: str  # what SQLite said about the damaged file
    kept_at: Path  # the damaged file, set aside
    conversations: int  # salvaged into the new database
    messages: int

    def describe(self) -> str:
        if self.conversations:
            got = (
                f"{self.conversations} conversation(s) with {self.messages} message(s) were recovered "
                "from it; anything else is lost"
            )
        else:
            got = "nothing could be recovered from it, so history starts empty"
        return (
            f"The chat history was damaged and could not be opened ({self.reason}); {got}. "
            f"The damaged file is kept at {self.kept_at}."
        )


class HistoryUnavailable(sqlite3.OperationalError):
    """The history is intact but cannot be opened now (the disk full, read-only or failing, the
    file locked): one line that says which and where. Nothing was set aside or changed."""


def _unavailable(path: Path, exc: sqlite3.Error) -> HistoryUnavailable:
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        free = -1
    if getattr(exc, "sqlite_errorcode", 0) & 0xFF == _SQLITE_FULL or 0 <= free < (1 << 20):
        return HistoryUnavailable(
            f"The chat history cannot be opened: the disk holding {path.parent} is full "
            f"({max(free, 0):,} bytes free). Free some space and start Parley again; nothing was lost."
        )
    return HistoryUnavailable(f"The chat history in {path} cannot be opened now ({exc}); nothing was changed.")


class _Damaged(Exception):
    pass


def is_damage(exc: sqlite3.DatabaseError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in _DAMAGE_CODES
    text = str(exc).lower()
    return "malformed" in text or "not a database" in text


def open_database(
    path: Path, busy_timeout_ms: int, setup: Callable[[sqlite3.Connection], None]
) -> tuple[sqlite3.Connection, HistoryRecovery | None]:
    """A connection with `setup` (pragmas, schema) applied; a damaged file is replaced first."""
    try:
        return _open_checked(path, busy_timeout_ms, setup), None
    except (_Damaged, sqlite3.DatabaseError) as exc:
        if isinstance(exc, sqlite3.DatabaseError) and not is_damage(exc):
            raise _unavailable(path, exc) from exc
        reason = str(exc)
    kept = _set_aside(path)
    log.warning("history database %s is damaged (%s); kept at %s, starting afresh", path, reason, kept)
    db = _connect(path, busy_timeout_ms)
    setup(db)
    conversations, messages = _salvage(kept, db)
    return db, HistoryRecovery(reason, kept, conversations, messages)


def _connect(path: Path, busy_timeout_ms: int) -> sqlite3.Connection:
    private_file(path)
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    db.row_factory = sqlite3.Row
    db.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
    sqlite_durable(db)
    return db


def _open_checked(path: Path, busy_timeout_ms: int, setup) -> sqlite3.Connection:
    db = _connect(path, busy_timeout_ms)
    try:
        problems = [r[0] for r in db.execute("PRAGMA quick_check(3)")]
        if problems != ["ok"]:
            raise _Damaged("; ".join(problems))
        setup(db)
        return db
    except BaseException:
        db.close()
        raise


def _set_aside(path: Path) -> Path:
    """Move the damaged file (and its WAL, which must never be replayed into a new database)
    to one `.damaged` copy, replacing an older copy."""
    kept = path.with_name(path.name + DAMAGED_SUFFIX)
    os.replace(path, kept)
    wal, kept_wal = Path(f"{path}-wal"), Path(f"{kept}-wal")
    if wal.exists():
        os.replace(wal, kept_wal)
    else:
        kept_wal.unlink(missing_ok=True)  # an older copy's WAL does not belong to this one
    Path(f"{path}-shm").unlink(missing_ok=True)
    Path(f"{kept}-shm").unlink(missing_ok=True)
    return kept


def _salvage(kept: Path, db: sqlite3.Connection) -> tuple[int, int]:
    """Copy the conversations and messages rows that still read back; stop a table at its first
    unreadable row."""
    try:
        src = sqlite3.connect(f"file:{kept}?mode=ro", uri=True)
    except sqlite3.Error:
        return 0, 0
    try:
        convs = _readable_rows(src, "SELECT id, title, created, updated, system_prompt, deleted FROM conversations")
        ids = {r[0] for r in convs}
        columns = {r[1] for r in _readable_rows(src, "PRAGMA table_info(messages)")}
        note = "note" if "note" in columns else "''"  # a database from before the note column
        names = "picture_names" if "picture_names" in columns else "'[]'"  # ... or before picture names
        parent = "parent" if "parent" in columns else "NULL"  # ... or before versions (set below)
        msgs = [
            r
            for r in _readable_rows(
                src,
                f"SELECT id, conversation, role, text, pictures, status, created, edited, {note}, {names},"
                f" {parent} FROM messages ORDER BY id",
            )
            if r[1] in ids
        ]
    finally:
        src.close()
    if not convs:
        return 0, 0
    db.execute("BEGIN IMMEDIATE")
    try:
        db.executemany(
            "INSERT OR IGNORE INTO conversations(id, title, created, updated, system_prompt, deleted)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            convs,
        )
        kept_msgs = 0
        for r in msgs:
            try:
                db.execute(
                    "INSERT INTO messages(id, conversation, role, text, pictures, status, created, edited, note,"
                    " picture_names, parent) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    r,
                )
                kept_msgs += 1
            except sqlite3.IntegrityError:  # a row the damage garbled past the schema's checks
                pass
        if parent == "NULL":
            db.execute(_LINEAR_PARENTS)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return len(convs), kept_msgs


def _readable_rows(src: sqlite3.Connection, sql: str) -> list[tuple]:
    rows: list[tuple] = []
    try:
        for row in src.execute(sql):
            rows.append(tuple(row))
    except sqlite3.Error:
        pass
    return rows
