"""app/history/history.py: conversations, messages, search, pictures, and surviving a killed process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import blake3
import pytest

from app.history.history import COMPLETE, INTERRUPTED, History, StoredPicture, Versions
from engine.pictures.document import PageRef

ROOT = Path(__file__).resolve().parents[3]


def test_database_is_wal(history):
    mode = history._query("PRAGMA journal_mode")[0][0]
    assert mode == "wal"


def test_conversations_newest_first_rename_and_system_prompt(history, monkeypatch):
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.0)  # a clock that does not tick between them
    a = history.create_conversation("first")
    b = history.create_conversation("second", system_prompt="be brief")
    assert [c.id for c in history.list_conversations()] == [b.id, a.id]
    history.add_message(a.id, "user", "hello")  # activity moves a conversation to the top
    assert [c.id for c in history.list_conversations()] == [a.id, b.id]
    history.rename(a.id, "renamed")
    history.set_system_prompt(a.id, "you are a cat")
    got = history.get_conversation(a.id)
    assert got.title == "renamed" and got.system_prompt == "you are a cat"
    assert history.get_conversation(b.id).system_prompt == "be brief"


def test_messages_keep_order_and_fields(history):
    c = history.create_conversation()
    u = history.add_message(c.id, "user", "what is this?")
    r = history.begin_reply(c.id)
    assert r.status == INTERRUPTED and r.role == "assistant" and r.text == ""
    history.update_reply(r.id, "A sq")
    assert history.get_message(r.id).text == "A sq"
    assert history.get_message(r.id).status == INTERRUPTED
    history.finish_reply(r.id, "A square.")
    msgs = history.messages(c.id)
    assert [(m.role, m.text, m.status) for m in msgs] == [
        ("user", "what is this?", COMPLETE),
        ("assistant", "A square.", COMPLETE),
    ]
    assert msgs[0].id == u.id and msgs[0].created <= msgs[1].created


def test_stopped_reply_is_saved_as_interrupted(history):
    c = history.create_conversation()
    history.add_message(c.id, "user", "count")
    r = history.begin_reply(c.id)
    history.finish_reply(r.id, "1 2 3", stopped=True)
    m = history.get_message(r.id)
    assert (m.text, m.status) == ("1 2 3", INTERRUPTED)


def test_an_edit_adds_a_version_and_the_old_one_keeps_what_followed_it(history):
    c = history.create_conversation()
    u1 = history.add_message(c.id, "user", "one")
    history.add_message(c.id, "assistant", "reply one")
    history.add_message(c.id, "user", "two")
    history.add_message(c.id, "assistant", "reply two")
    edited = history.add_version(u1.id, "uno")
    assert edited.edited is not None and edited.id != u1.id
    assert [(m.role, m.text) for m in history.messages(c.id)] == [("user", "uno")]
    assert history.versions(c.id) == {edited.id: Versions((u1.id, edited.id), 1)}
    history.add_message(c.id, "assistant", "respuesta uno")
    history.show_version(u1.id)  # back: the old version with the turns that followed it
    assert [m.text for m in history.messages(c.id)] == ["one", "reply one", "two", "reply two"]
    assert history.versions(c.id)[u1.id] == Versions((u1.id, edited.id), 0)
    history.show_version(edited.id)
    assert [m.text for m in history.messages(c.id)] == ["uno", "respuesta uno"]
    assert history.messages(c.id)[0].edited is not None


def test_a_regenerated_reply_is_a_version_of_the_reply_and_a_later_version_is_kept_inside(history):
    c = history.create_conversation()
    u = history.add_message(c.id, "user", "one")
    a1 = history.add_message(c.id, "assistant", "first answer")
    u2 = history.add_message(c.id, "user", "two")
    a2 = history.add_message(c.id, "assistant", "second answer")
    history.show_until(u2.id)  # regenerate the second reply
    a2b = history.begin_reply(c.id)
    history.finish_reply(a2b.id, "second answer, again")
    assert [m.text for m in history.messages(c.id)] == ["one", "first answer", "two", "second answer, again"]
    assert history.versions(c.id) == {a2b.id: Versions((a2.id, a2b.id), 1)}
    history.show_until(u.id)  # regenerate the first reply: the second turn stays with the old one
    a1b = history.begin_reply(c.id)
    assert [m.id for m in history.messages(c.id)] == [u.id, a1b.id]
    history.show_version(a1.id)  # back to the first answer: its later turn, its newest reply
    assert [m.id for m in history.messages(c.id)] == [u.id, a1.id, u2.id, a2b.id]


def test_a_failed_reply_is_deleted_with_all_that_followed_it_in_every_version(history):
    c = history.create_conversation()
    history.add_message(c.id, "user", "one")
    a1 = history.add_message(c.id, "assistant", "reply one")
    u2 = history.add_message(c.id, "user", "two")
    history.add_version(u2.id, "deux")
    assert history.delete_from(a1.id) == 3  # the reply, "two" and its version "deux"
    assert [m.text for m in history.messages(c.id)] == ["one"]
    assert history.versions(c.id) == {}


def test_versions_stay_inside_their_conversation(history):
    a = history.create_conversation()
    b = history.create_conversation()
    ua = history.add_message(a.id, "user", "a1")
    history.add_message(b.id, "user", "b1")
    history.add_message(a.id, "assistant", "a2")
    history.add_version(ua.id, "a1 edited")
    assert [m.text for m in history.messages(b.id)] == ["b1"]
    assert [m.text for m in history.messages(a.id)] == ["a1 edited"]
    assert history.versions(b.id) == {}


def test_delete_undo_and_purge(history):
    c = history.create_conversation("doomed")
    history.add_message(c.id, "user", "findable words")
    history.delete_conversation(c.id)
    assert history.list_conversations() == []
    assert history.search("findable") == []
    assert history.get_conversation(c.id).deleted is not None
    history.restore_conversation(c.id)
    assert [x.id for x in history.list_conversations()] == [c.id]
    assert history.search("findable")
    history.delete_conversation(c.id)
    assert history.purge_deleted() == [c.id]
    assert history.get_conversation(c.id) is None
    assert history.messages(c.id) == []


def test_search_by_text_and_title(history):
    a = history.create_conversation("Holiday pictures")
    b = history.create_conversation("Code")
    history.add_message(a.id, "user", "Is this a red Triangle?")
    history.add_message(b.id, "assistant", "Use `concatenate` here")
    hits = history.search("triangle")
    assert [(h.conversation_id, h.title) for h in hits] == [(a.id, "Holiday pictures")]
    assert "Triangle" in hits[0].snippet
    assert [h.conversation_id for h in history.search("cat")] == [b.id]  # substring
    assert [h.conversation_id for h in history.search("holiday")] == [a.id]  # title
    assert history.search("is") and history.search("zz") == []  # short query: LIKE
    assert history.search("100%") == []
    # every version is searchable; deleted text is not
    m = history.messages(a.id)[0]
    edited = history.add_version(m.id, "a blue circle")
    assert [h.message_id for h in history.search("triangle")] == [m.id]
    assert history.search("blue circle")[0].message_id == edited.id
    history.delete_from(edited.id)
    assert history.search("blue circle") == []


def test_pictures_content_addressed_and_survive_the_original_moving(history, tmp_path):
    src = tmp_path / "Photo.JPG"
    data = os.urandom(5000)
    src.write_bytes(data)
    ref = history.add_picture(src)
    assert ref == blake3.blake3(data).hexdigest() + ".jpg"
    assert history.add_picture(src) == ref  # same bytes, same ref, no second copy
    copy = tmp_path / "other-name.jpg"
    copy.write_bytes(data)
    assert history.add_picture(copy) == ref
    c = history.create_conversation()
    history.add_message(c.id, "user", "look", pictures=[ref])
    src.unlink()
    copy.unlink()
    stored = history.picture_path(history.messages(c.id)[0].pictures[0])
    assert stored.read_bytes() == data
    assert stored.is_relative_to(history.data_dir)
    assert len(list(history.pictures_dir.glob("*/*"))) == 1


def test_picture_bytes_and_orphan_purge(history):
    kept = history.add_picture_bytes(b"\x89PNG fake one", ".png")
    draft = history.add_picture_bytes(b"\x89PNG fake two", ".png")
    orphan = history.add_picture_bytes(b"\x89PNG fake three", ".png")
    c = history.create_conversation()
    history.add_message(c.id, "user", "x", pictures=[kept])
    assert history.purge_orphan_pictures(keep=[draft]) == 1
    assert history.picture_path(kept).exists() and history.picture_path(draft).exists()
    assert not history.picture_path(orphan).exists()


def test_bad_picture_refs_are_refused(history):
    c = history.create_conversation()
    with pytest.raises(ValueError):
        history.add_message(c.id, "user", "x", pictures=["../../etc/passwd"])
    with pytest.raises(ValueError):
        history.picture_path("/abs/path.png")


def test_a_stored_picture_names_its_digest_file_and_fragment(history, tmp_path):
    """A message's picture, typed: the digest the engine's cache is keyed by comes from the parsed
    name (no read, no slicing elsewhere), a page keeps its fragment, the person's file name rides
    along; what the engine is sent is made in one place (History.picture_ref)."""
    data = b"%PDF-1.4 not really"
    src = tmp_path / "report.pdf"
    src.write_bytes(data)
    digest = blake3.blake3(data).hexdigest()
    stored = history.add_file(src, digest)
    page = StoredPicture.parse(stored + "#p=2@144", "report.pdf")
    assert (page.digest, page.extension, page.fragment, page.name) == (digest, ".pdf", "p=2@144", "report.pdf")
    assert (page.file, page.ref) == (stored, stored + "#p=2@144")
    plain = StoredPicture.parse("ab" * 32 + ".png")
    assert (plain.digest, plain.extension, plain.fragment, plain.name) == ("ab" * 32, ".png", "", "")

    c = history.create_conversation()
    msg = history.add_message(c.id, "user", "page 3?", [page, plain])
    assert history.messages(c.id)[0].named_pictures() == [page, plain] == msg.named_pictures()
    sent = history.picture_ref(page)
    assert isinstance(sent, PageRef) and sent.path == str(history.picture_path(stored))
    assert sent.digest == PageRef.of(sent.path, digest, 2, 144, "report.pdf").digest != digest
    assert "report.pdf" in (sent.caption or "")
    assert history.picture_ref(plain.ref).digest == plain.digest  # a bare ref: the same conversion


@pytest.mark.parametrize(
    "bad",
    ["../../etc/passwd", "ab" * 32 + ".png#p=x", "AB" * 32 + ".png", "ab" * 31 + ".png", "ab" * 32 + ".png#t=1"],
)
def test_a_stored_picture_with_a_bad_part_is_refused(history, bad):
    with pytest.raises(ValueError):
        StoredPicture.parse(bad)
    with pytest.raises(ValueError):
        history.add_message(history.create_conversation().id, "user", "x", pictures=[bad])


def test_reopen_sees_everything(tmp_path):
    h = History(tmp_path / "d")
    c = h.create_conversation("kept")
    h.add_message(c.id, "user", "hi")
    h.close()
    h2 = History(tmp_path / "d")
    assert [m.text for m in h2.messages(c.id)] == ["hi"]
    h2.close()


_CHILD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from app.history.history import History
    h = History({data!r})
    c = h.create_conversation("crashy")
    for i in range(3):
        h.add_message(c.id, "user", f"question {{i}}")
        r = h.begin_reply(c.id)
        h.finish_reply(r.id, f"answer {{i}}")
    h.add_message(c.id, "user", "last question")
    r = h.begin_reply(c.id)
    text = ""
    for i in range(100000):
        text += f"tok{{i}} "
        h.update_reply(r.id, text)
        if i == 20:
            print("streaming", flush=True)
        time.sleep(0.002)
""")


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="SIGKILL is POSIX only")
def test_sigkill_mid_reply_loses_nothing_completed(tmp_path):
    data = tmp_path / "data"
    code = _CHILD.format(root=str(ROOT), data=str(data))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "streaming"
        time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    h = History(data)
    [c] = h.list_conversations()
    msgs = h.messages(c.id)
    assert [(m.role, m.text, m.status) for m in msgs[:7]] == [
        ("user", "question 0", COMPLETE),
        ("assistant", "answer 0", COMPLETE),
        ("user", "question 1", COMPLETE),
        ("assistant", "answer 1", COMPLETE),
        ("user", "question 2", COMPLETE),
        ("assistant", "answer 2", COMPLETE),
        ("user", "last question", COMPLETE),
    ]
    last = msgs[7]
    assert last.role == "assistant" and last.status == INTERRUPTED
    assert last.text.startswith("tok0 tok1 ") and "tok20 " in last.text
    h.close()


def test_a_damaged_stored_picture_is_healed_by_the_next_import(history, tmp_path):
    data = os.urandom(3000)
    ref = history.add_picture_bytes(data, ".png")
    history.picture_path(ref).write_bytes(data[:100])  # cut short outside Parley
    assert history.add_picture_bytes(data, ".png") == ref
    assert history.picture_path(ref).read_bytes() == data


def test_a_search_snippet_begins_at_the_matched_word(history):
    """Issue 40: the snippet began a third of its width before the match, and the sidebar, which
    cuts it at the right, showed only the words before it."""
    c = history.create_conversation("Long reply")
    before = "The picture shows, from the left edge to the right one, several shapes drawn on paper:"
    history.add_message(c.id, "assistant", f"{before}\na small\n\nTriangle-shaped kite and a blue circle further on.")
    for query in ("triangle", "angle-sha", "tri"):  # a whole word, inside a word, a short (LIKE) query
        snippet = history.search(query)[0].snippet
        assert snippet.startswith("…Triangle-shaped kite and a blue circle"), (query, snippet)
    # a match at the very start keeps the start, without a leading "…"
    assert history.search("The picture")[0].snippet.startswith("The picture shows, from the left")
    assert "\n" not in history.search("kite")[0].snippet
