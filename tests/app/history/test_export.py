"""app/history/export.py and `main.py export`: a chat written out as Markdown (pictures in a folder
beside it) and JSON, with names any OS accepts, never over an earlier export, a damaged picture
named instead of stopping the rest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import blake3
import pytest
from PIL import Image

from app.history.export import ExportError, export_chat, find_chat, safe_name
from app.history.history import History, StoredPicture
from tests.fixtures.documents import make_pdf, make_video
from tests.fixtures.pictures import picture_bytes

ROOT = Path(__file__).resolve().parents[3]


def _chat(history: History, tmp_path: Path, title: str = "Shapes: red/blue?") -> str:
    """A chat with a picture sent twice, a PDF page, a video frame and a stopped reply."""
    c = history.create_conversation(title, system_prompt="Answer briefly.")
    cat = StoredPicture.parse(history.add_picture_bytes(picture_bytes(1), ".png"), "cat photo.png")
    pdf = make_pdf(tmp_path / "report.pdf", pages=3)
    stored_pdf = history.add_file(pdf, blake3.blake3(pdf.read_bytes()).hexdigest())
    page = StoredPicture.parse(stored_pdf + "#p=1@72", "report.pdf")
    clip = make_video(tmp_path / "clip.mp4", seconds=2.0)
    stored_clip = history.add_file(clip, blake3.blake3(clip.read_bytes()).hexdigest())
    frame = StoredPicture.parse(stored_clip + "#t=1@1/16", "clip.mp4")
    history.add_message(c.id, "user", "What is in this picture?", [cat])
    r = history.begin_reply(c.id)
    history.finish_reply(r.id, "A **cat**.", note="Read 12 tokens")
    history.add_message(c.id, "user", "And here, with the same cat?", [page, frame, cat])
    r = history.begin_reply(c.id)
    history.finish_reply(r.id, "A page and a fr", stopped=True)
    return c.id


def _linked_files(markdown: str, folder: Path) -> list[Path]:
    links = [line.split("](", 1)[1].rstrip(")") for line in markdown.splitlines() if line.startswith("![")]
    return [folder / unquote(link) for link in links]


def test_a_chat_exports_as_markdown_with_its_pictures_and_as_json(history, tmp_path):
    cid = _chat(history, tmp_path)
    out = tmp_path / "exports"
    done = export_chat(history, cid, out)

    assert done.markdown == out / "Shapes red blue.md" and done.json == out / "Shapes red blue.json"
    assert done.pictures == 3 and done.missing == ()  # the cat sent twice is written once
    md = done.markdown.read_text(encoding="utf-8")
    assert md.startswith("# Shapes: red/blue?\n")
    assert "Answer briefly." in md and "A **cat**." in md and "*(stopped before the end)*" in md
    files = _linked_files(md, out)
    assert [f.name for f in files] == [
        "01 cat photo.png",
        "02 report.pdf, page 2.png",
        "03 clip.mp4, frame at 0 01.png",
        "01 cat photo.png",
    ]
    assert all(f.is_file() and f.parent == done.folder for f in files)
    assert files[0].read_bytes() == picture_bytes(1)  # a picture keeps its own bytes
    page = history.picture_ref(history.messages(cid)[2].named_pictures()[0])
    with Image.open(files[1]) as shown:
        assert shown.size == page.picture().size  # the page as the model was given it (72 dpi)
    with Image.open(files[2]) as frame:
        assert frame.size == (64, 48)

    doc = json.loads(done.json.read_text(encoding="utf-8"))
    assert doc["format"] == "parley-chat" and doc["chat"]["title"] == "Shapes: red/blue?"
    assert doc["chat"]["instructions"] == "Answer briefly."
    assert [(m["role"], m["complete"]) for m in doc["messages"]] == [
        ("user", True),
        ("assistant", True),
        ("user", True),
        ("assistant", False),
    ]
    assert doc["messages"][1]["turn"] == "Read 12 tokens"
    sent = doc["messages"][2]["pictures"]
    assert [(p["kind"], p["caption"]) for p in sent] == [
        ("page", "report.pdf, page 2"),
        ("frame", "clip.mp4, frame at 0:01"),
        ("picture", "cat photo.png"),
    ]
    assert [(out / p["file"]).resolve() for p in sent] == [f.resolve() for f in files[1:]]


def test_an_export_never_overwrites_an_earlier_one(history, tmp_path):
    cid = _chat(history, tmp_path)
    first = export_chat(history, cid, tmp_path / "out")
    before = first.markdown.read_bytes()
    second = export_chat(history, cid, tmp_path / "out")
    assert second.markdown.name == "Shapes red blue (2).md" and second.folder.name == "Shapes red blue (2)"
    assert first.markdown.read_bytes() == before
    assert _linked_files(second.markdown.read_text(encoding="utf-8"), tmp_path / "out")[0].parent == second.folder


def test_a_damaged_picture_is_named_and_the_rest_exported(history, tmp_path):
    cid = _chat(history, tmp_path)
    cat = history.messages(cid)[0].named_pictures()[0]
    path = history.picture_path(cat.ref)
    path.chmod(0o600)
    path.write_bytes(b"not the picture any more")
    done = export_chat(history, cid, tmp_path / "out")
    assert done.pictures == 2 and len(done.missing) == 1 and "cat photo.png" in done.missing[0]
    md = done.markdown.read_text(encoding="utf-8")
    assert "*(cat photo.png: not exported, its stored file is gone or damaged)*" in md
    assert json.loads(done.json.read_text(encoding="utf-8"))["messages"][0]["pictures"][0]["file"] is None


@pytest.mark.parametrize(
    ("title", "name"),
    [
        ("CON", "_CON"),
        ("com1.txt", "_com1.txt"),
        ('a<b>c:"d"/e\\f|g?h*', "a b c d e f g h"),
        ("ends with dots...", "ends with dots"),
        ("  \t\n ", "Chat"),
        ("..", "Chat"),
        ("tab\tand\x00nul", "tab and nul"),
        ("x" * 300, "x" * 80),
    ],
)
def test_names_are_safe_on_windows_too(title, name):
    assert safe_name(title) == name


def test_a_chat_is_found_by_id_start_or_title_and_a_wrong_name_says_so(history):
    a = history.create_conversation("Holiday photos")
    history.create_conversation("Two")
    history.create_conversation("Two")
    assert find_chat(history, a.id).id == a.id
    assert find_chat(history, a.id[:8]).id == a.id
    assert find_chat(history, "holiday  PHOTOS").id == a.id
    with pytest.raises(ExportError, match="No chat is called “nope”"):
        find_chat(history, "nope")
    with pytest.raises(ExportError, match="2 chats are called “Two”"):
        find_chat(history, "Two")
    history.delete_conversation(a.id)
    with pytest.raises(ExportError):
        find_chat(history, a.id)


def test_main_export_lists_chats_writes_the_export_and_refuses_in_one_line(history, tmp_path):
    cid = _chat(history, tmp_path)
    data = str(history.data_dir)
    history.close()

    def main(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(ROOT / "main.py"), "export", "--data-dir", data, *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )

    listed = main("--list")
    assert listed.returncode == 0 and listed.stdout.startswith(cid[:8] + "  ")
    assert listed.stdout.rstrip("\n").endswith("  Shapes: red/blue?")
    done = main(cid[:8], "--to", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "Shapes red blue.md").is_file() and "3 pictures" in done.stdout
    missing = main("no such chat", "--to", str(tmp_path / "out"))
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1 and "No chat is called" in missing.stderr
    nowhere = main("--list", "--data-dir", str(tmp_path / "empty"))
    assert nowhere.returncode == 1 and "has no history" in nowhere.stderr
    assert not (tmp_path / "empty").exists()  # a mistyped folder is not made into a data folder


def test_the_json_holds_every_version_and_the_markdown_the_one_shown(history, tmp_path):
    cid = _chat(history, tmp_path)
    first = history.messages(cid)[0]
    edited = history.add_version(first.id, "What animal is this?")  # the first question, edited
    reply = history.begin_reply(cid)
    history.finish_reply(reply.id, "A cat.")
    done = export_chat(history, cid, tmp_path / "out")
    md = done.markdown.read_text(encoding="utf-8")
    assert "What animal is this?" in md and "What is in this picture?" not in md
    assert "4 more messages of its other versions are in the JSON" in md
    doc = json.loads(done.json.read_text(encoding="utf-8"))
    by_id = {m["id"]: m for m in doc["messages"]}
    assert len(by_id) == 6 and [m["id"] for m in doc["messages"] if m["shown"]] == [edited.id, reply.id]
    assert by_id[edited.id]["parent"] is None and by_id[first.id]["parent"] is None  # two versions of the first
    old_path = [first.id]
    while kids := [m["id"] for m in doc["messages"] if m["parent"] == old_path[-1]]:
        old_path.append(kids[0])
    assert [by_id[i]["text"] for i in old_path][-1] == "A page and a fr"  # the old version, whole
    assert all((tmp_path / "out" / p["file"]).is_file() for m in doc["messages"] for p in m["pictures"])
