"""History under faults: a damaged database is set aside (one copy) and history goes on; a write
that cannot begin (another process holds the lock) leaves no lock, transaction or FULL sync behind;
conversations and pictures are private to the user."""

from __future__ import annotations

import os
import sqlite3
import stat
import threading

import pytest

from app.history.history import History
from app.history.history_db import DAMAGED_SUFFIX
from tests.fixtures.pictures import make_picture

GARBAGE = b"this is not a database, it is what a bad disk left behind\n" * 200


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_garbage_database_is_set_aside_once_and_history_starts_empty(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "history.sqlite3").write_bytes(GARBAGE)
    (data / "history.sqlite3-wal").write_bytes(b"stale wal of the damaged file")
    h = History(data)
    try:
        rec = h.recovery
        assert rec is not None and rec.conversations == 0
        assert rec.kept_at == data / ("history.sqlite3" + DAMAGED_SUFFIX)
        assert rec.kept_at.read_bytes() == GARBAGE  # the copy is the damaged file, untouched
        assert str(rec.kept_at) in rec.describe() and "damaged" in rec.describe()
        assert h.list_conversations() == []
        conv = h.create_conversation("after the damage")
        h.add_message(conv.id, "user", "still works")
    finally:
        h.close()
    again = History(data)
    try:
        assert again.recovery is None
        assert [m.text for m in again.messages(conv.id)] == ["still works"]
    finally:
        again.close()
    # damaged again on a later start: still one copy, holding the latest damage
    (data / "history.sqlite3").write_bytes(GARBAGE[::-1])
    third = History(data)
    third.close()
    kept = sorted(p.name for p in data.iterdir() if DAMAGED_SUFFIX in p.name)
    assert kept == ["history.sqlite3" + DAMAGED_SUFFIX]
    assert (data / kept[0]).read_bytes() == GARBAGE[::-1]


def test_damaged_index_page_salvages_the_conversations(tmp_path):
    data = tmp_path / "data"
    h = History(data)
    convs = [h.create_conversation(f"chat {i}") for i in range(3)]
    for c in convs:
        h.add_message(c.id, "user", f"hello from {c.title}")
        h.add_message(c.id, "assistant", "hi")
    h.close()
    db_path = data / "history.sqlite3"
    with sqlite3.connect(db_path) as db:
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'messages_by_conversation'").fetchone()[0]
    db.close()
    with open(db_path, "r+b") as f:  # wreck one index page; the tables stay readable
        f.seek((root - 1) * page_size)
        f.write(b"\xff" * page_size)
    h2 = History(data)
    try:
        assert h2.recovery is not None
        assert (h2.recovery.conversations, h2.recovery.messages) == (3, 6)
        assert {c.title for c in h2.list_conversations()} == {"chat 0", "chat 1", "chat 2"}
        assert [m.text for m in h2.messages(convs[1].id)] == ["hello from chat 1", "hi"]
        assert h2.search("hello from chat 2")  # the full-text index was rebuilt with the rows
        assert "3 conversation(s) with 6 message(s) were recovered" in h2.recovery.describe()
    finally:
        h2.close()


def test_locked_database_is_not_damage(tmp_path):
    data = tmp_path / "data"
    History(data).close()
    holder = sqlite3.connect(data / "history.sqlite3", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # journal_mode=WAL still needs this lock to open
    try:
        with pytest.raises(sqlite3.OperationalError):
            History(data, busy_timeout_s=0.1)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert not (data / ("history.sqlite3" + DAMAGED_SUFFIX)).exists()


def test_write_that_cannot_begin_releases_its_lock_and_sync_mode(tmp_path):
    h = History(tmp_path / "data", busy_timeout_s=0.1)
    conv = h.create_conversation("first")
    other = sqlite3.connect(h.db_path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process is writing
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            h.rename(conv.id, "second")  # durable: sets synchronous=FULL before BEGIN
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert h._query("PRAGMA synchronous")[0][0] == 1  # NORMAL again, not FULL (2)
    done = threading.Event()

    def write_from_another_thread():
        h.rename(conv.id, "third")
        done.set()

    t = threading.Thread(target=write_from_another_thread, daemon=True)
    t.start()
    t.join(10)
    assert done.is_set(), "the history lock was never released"
    assert h.get_conversation(conv.id).title == "third"
    h.close()


@pytest.mark.skipif(os.name != "posix", reason="POSIX modes")
def test_history_and_pictures_are_private(tmp_path):
    old = os.umask(0o022)  # the usual umask, which made everything world-readable
    try:
        data = tmp_path / "new" / "data"
        h = History(data)
        conv = h.create_conversation()
        ref = h.add_picture(make_picture(tmp_path / "a.png", 1))
        ref2 = h.add_picture_bytes(b"\x89PNG not really", ".png")
        h.add_message(conv.id, "user", "look", [ref, ref2])
        assert mode(data) == 0o700
        assert mode(data / "pictures") == 0o700
        assert mode(h.picture_path(ref).parent) == 0o700
        assert mode(h.picture_path(ref)) == 0o600 and mode(h.picture_path(ref2)) == 0o600
        for name in ("history.sqlite3", "history.sqlite3-wal", "history.sqlite3-shm"):
            assert mode(data / name) == 0o600, name
        h.close()
    finally:
        os.umask(old)


@pytest.mark.skipif(os.name != "posix", reason="POSIX modes")
def test_an_older_open_history_is_tightened(tmp_path):
    data = tmp_path / "data"
    History(data).close()
    os.chmod(data / "pictures", 0o755)
    os.chmod(data / "history.sqlite3", 0o644)
    History(data).close()
    assert mode(data / "pictures") == 0o700 and mode(data / "history.sqlite3") == 0o600


def test_a_full_disk_at_open_is_one_clear_line_and_nothing_is_lost(small_disk):
    # found by tests/bench/soak.py (seed 7): a start on a full disk raised SQLite's bare
    # "database or disk is full" from create_schema, with no word of which disk or what to do
    from app.history import HistoryUnavailable

    data = small_disk.root / "data"
    h = History(data)
    conv = h.create_conversation("kept")
    h.add_message(conv.id, "user", "written before the disk filled")
    h.close()
    small_disk.fill()
    with pytest.raises(HistoryUnavailable) as refused:
        History(data)
    line = str(refused.value)
    assert "\n" not in line and "full" in line and str(small_disk.root) in line, line
    assert isinstance(refused.value, sqlite3.OperationalError)  # callers that catch SQLite's errors still do
    assert not (data / ("history.sqlite3" + DAMAGED_SUFFIX)).exists()  # a full disk is not damage
    small_disk.free()
    again = History(data)
    try:
        assert [m.text for m in again.messages(conv.id)] == ["written before the disk filled"]
    finally:
        again.close()
