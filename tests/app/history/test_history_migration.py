"""A history database written before a schema change opens with nothing lost: every row reads as
before, search still finds its words, and the new column (messages.note, a reply's turn line) is
there for the next reply. The version-1 database is written here with the exact statements
Parley 1 ran (frozen below), not with today's schema."""

from __future__ import annotations

import sqlite3

from app.history.history import COMPLETE, INTERRUPTED, History
from app.history.history_db import _FTS_SCHEMA, DAMAGED_SUFFIX, SCHEMA_VERSION

# app/history/history_db.py's _SCHEMA at schema version 1, as released
SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS conversations (
    id            TEXT PRIMARY KEY,
    title         TEXT NOT NULL,
    created       REAL NOT NULL,
    updated       REAL NOT NULL,
    system_prompt TEXT,
    deleted       REAL
);
CREATE TABLE IF NOT EXISTS messages (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role         TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'system')),
    text         TEXT NOT NULL,
    pictures     TEXT NOT NULL DEFAULT '[]',
    status       TEXT NOT NULL CHECK (status IN ('complete', 'interrupted')),
    created      REAL NOT NULL,
    edited       REAL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation, id);
CREATE INDEX IF NOT EXISTS conversations_by_updated ON conversations(updated);
"""

CONVERSATIONS = [
    ("c1", "Where is the red circle?", 100.0, 130.0, None, None),
    ("c2", "Old chat", 50.0, 60.0, "Answer in French.", None),
    ("c3", "Deleted a moment ago", 70.0, 80.0, None, 90.0),
]
MESSAGES = [
    (1, "c1", "user", "Where is the red circle?", "[]", "complete", 101.0, None),
    (2, "c1", "assistant", "Top left, beside a blue square.", "[]", "complete", 102.0, None),
    (3, "c1", "user", "And the triangle?", "[]", "complete", 110.0, 111.5),
    (4, "c1", "assistant", "Bottom rig", "[]", "interrupted", 112.0, None),
    (5, "c2", "user", "Bonjour", "[]", "complete", 51.0, None),
    (6, "c3", "user", "gone soon", "[]", "complete", 71.0, None),
]


def write_v1(path) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript("BEGIN;" + SCHEMA_V1 + "PRAGMA user_version=1;COMMIT;")
    db.executescript("BEGIN;" + _FTS_SCHEMA + "COMMIT;")
    db.executemany("INSERT INTO conversations VALUES (?, ?, ?, ?, ?, ?)", CONVERSATIONS)
    db.executemany("INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?)", MESSAGES)
    db.close()


def test_a_version_1_history_opens_with_every_row_and_gains_the_turn_line(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_v1(data / "history.sqlite3")
    h = History(data)
    try:
        assert h.recovery is None  # an older schema is not damage
        convs = {c.id: c for c in h.list_conversations(include_deleted=True)}
        assert {c: (v.title, v.created, v.updated, v.system_prompt, v.deleted) for c, v in convs.items()} == {
            row[0]: row[1:] for row in CONVERSATIONS
        }
        got = [
            (m.id, m.conversation_id, m.role, m.text, "[]", m.status, m.created, m.edited, m.note)
            for c in ("c1", "c2", "c3")
            for m in h.messages(c)
        ]
        assert got == [row + ("",) for row in MESSAGES]  # older replies: no line, nothing else changed
        assert [m.status for m in h.messages("c1")] == [COMPLETE, COMPLETE, COMPLETE, INTERRUPTED]
        assert [hit.message_id for hit in h.search("blue square")] == [2]  # the full-text index still serves

        reply = h.begin_reply("c1")
        h.finish_reply(reply.id, "Bottom right.", note="Continued 40 tokens from memory · 12 tok/s")
    finally:
        h.close()
    db = sqlite3.connect(data / "history.sqlite3")
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    db.close()
    again = History(data)  # opening a migrated database again changes nothing
    try:
        assert again.recovery is None
        assert [m.note for m in again.messages("c1")][-1] == "Continued 40 tokens from memory · 12 tok/s"
        assert len(again.messages("c1")) == 5
    finally:
        again.close()


def test_a_newer_parleys_database_keeps_its_version(tmp_path):
    """Opening a database a later version wrote must not mark it older than it is."""
    data = tmp_path / "data"
    History(data).close()
    with sqlite3.connect(data / "history.sqlite3") as db:
        db.execute("PRAGMA user_version=7")
    db.close()
    History(data).close()
    db = sqlite3.connect(data / "history.sqlite3")
    assert db.execute("PRAGMA user_version").fetchone()[0] == 7
    db.close()


def test_a_damaged_version_1_history_salvages_its_messages(tmp_path):
    """Salvage reads an older database's rows too (it has no note column)."""
    data = tmp_path / "data"
    data.mkdir()
    path = data / "history.sqlite3"
    write_v1(path)
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'messages_by_conversation'").fetchone()[0]
    db.close()
    with open(path, "r+b") as f:  # wreck one index page; the tables stay readable
        f.seek((root - 1) * page_size)
        f.write(b"\xff" * page_size)
    h = History(data)
    try:
        assert h.recovery is not None and h.recovery.kept_at.name == "history.sqlite3" + DAMAGED_SUFFIX
        assert (h.recovery.conversations, h.recovery.messages) == (3, 6)
        assert [m.text for m in h.messages("c1")] == [r[3] for r in MESSAGES if r[1] == "c1"]
        assert all(m.note == "" for m in h.messages("c1"))
    finally:
        h.close()
