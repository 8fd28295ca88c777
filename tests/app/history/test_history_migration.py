"""A history database written before a schema change opens with nothing lost: every row reads as
before, search still finds its words, and the new columns (version 2: messages.note, a reply's
turn line; version 3: messages.picture_names, the file each picture came from; version 4:
messages.parent and conversations.leaf, a chat's versions) are there for the next message. Older
databases are written here with the exact statements those versions ran (frozen below), not with
today's schema."""

from __future__ import annotations

import sqlite3

from app.history.history import COMPLETE, INTERRUPTED, History, StoredPicture
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


def older_database(path, schema: str, version: int) -> sqlite3.Connection:
    """An empty history database as Parley at `version` made it (its tables, the full-text index)."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript("BEGIN;" + schema + f"PRAGMA user_version={version};COMMIT;")
    db.executescript("BEGIN;" + _FTS_SCHEMA + "COMMIT;")
    return db


def write_v1(path) -> None:
    db = older_database(path, SCHEMA_V1, 1)
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
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
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


# app/history_db.py's _SCHEMA at schema version 2, as released
SCHEMA_V2 = """
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
    edited       REAL,
    note         TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation, id);
CREATE INDEX IF NOT EXISTS conversations_by_updated ON conversations(updated);
"""

PAGE_2 = "ab" * 32 + ".pdf#p=1@144"  # page 2 of a stored PDF (a ref reads no file)


def test_a_version_2_history_keeps_its_pages_and_names_new_ones(tmp_path):
    """A page a version-2 Parley stored has no file name: it reads as before and its caption says
    its number only ("Page 2"); a page sent now keeps its file's name ("report.pdf, page 2"),
    through an edit that leaves the pictures as they were and a reopening."""
    data = tmp_path / "data"
    data.mkdir()
    db = older_database(data / "history.sqlite3", SCHEMA_V2, 2)
    db.execute("INSERT INTO conversations VALUES ('c1', 'Pages', 100.0, 102.0, NULL, NULL)")
    db.execute(
        "INSERT INTO messages VALUES (1, 'c1', 'user', 'What is on page 2?', ?, 'complete', 101.0, NULL, '')",
        (f'["{PAGE_2}"]',),
    )
    db.execute("INSERT INTO messages VALUES (2, 'c1', 'assistant', 'A table.', '[]', 'complete', 102.0, NULL, 'x')")
    db.close()

    h = History(data)
    try:
        assert h.recovery is None
        old, reply = h.messages("c1")
        assert (old.text, old.pictures, old.names, reply.note) == ("What is on page 2?", (PAGE_2,), (), "x")
        assert [h.picture_ref(p).caption for p in old.named_pictures()] == ["Page 2"]
        named = StoredPicture.parse(PAGE_2, "report.pdf")
        new = h.add_message("c1", "user", "And this one?", [named, "cd" * 32 + ".png"])
        assert new.names == ("report.pdf", "")
        h.add_version(new.id, "And this one, please?")  # the pictures as they were: their names too
    finally:
        h.close()
    with sqlite3.connect(data / "history.sqlite3") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    db.close()
    again = History(data)
    try:
        *_, new = again.messages("c1")
        assert new.text == "And this one, please?" and new.names == ("report.pdf", "")
        refs = [again.picture_ref(p) for p in new.named_pictures()]
        assert [r.caption for r in refs] == ["report.pdf, page 2", None]  # a plain picture has none
        assert again.picture_ref(PAGE_2).digest == refs[0].digest  # the name is not the picture's identity
    finally:
        again.close()


# _SCHEMA at version 3 (released): version 1's tables with the note and picture_names columns
SCHEMA_V3 = SCHEMA_V1.replace(
    "    edited       REAL\n);",
    "    edited       REAL,\n    note         TEXT NOT NULL DEFAULT '',\n"
    "    picture_names TEXT NOT NULL DEFAULT '[]'\n);",
)


def test_a_version_3_history_reads_as_one_version_and_takes_new_ones(tmp_path):
    """Messages of two chats written in turn: each message follows the one before it in its own
    chat, so every chat reads as it did, one version, and an edit then adds a second."""
    data = tmp_path / "data"
    data.mkdir()
    db = older_database(data / "history.sqlite3", SCHEMA_V3, 3)
    db.executemany("INSERT INTO conversations VALUES (?, ?, ?, ?, ?, ?)", CONVERSATIONS)
    db.executemany("INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?, '', '[]')", MESSAGES)
    db.execute("INSERT INTO messages VALUES (7, 'c2', 'assistant', 'Salut', '[]', 'complete', 52.0, NULL, 'n', '[]')")
    db.close()

    h = History(data)
    try:
        assert h.recovery is None
        assert [m.id for m in h.messages("c1")] == [1, 2, 3, 4]
        assert [m.id for m in h.messages("c2")] == [5, 7]
        assert h.versions("c1") == {} and h.messages("c2")[1].note == "n"
        edited = h.add_version(3, "And the square?")
        assert [m.id for m in h.messages("c1")] == [1, 2, edited.id]
        assert [x.message_id for x in h.search("triangle")] == [3]  # the old version is still found
    finally:
        h.close()
    with sqlite3.connect(data / "history.sqlite3") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 4
        assert db.execute("SELECT id, parent FROM messages WHERE conversation = 'c2' ORDER BY id").fetchall() == [
            (5, None),
            (7, 5),
        ]
    db.close()
