"""PDFs and videos in the window: a dropped PDF is one chip with its page count and a page range
(all pages up to a limit by default, saying which are left out); the chat shows page thumbnails;
a second conversation on the same pages encodes nothing; settings choose the PDF's text and the
video sampling; a bad file is one line and the draft stays."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from app.attachment_chip import DEFAULT_PAGES, AttachmentChip
from app.thumbnails import read_scaled
from engine.pictures.video import FrameSampling
from tests.fixtures.documents import make_encrypted_pdf, make_pdf, make_video
from tests.test_app_pictures import drop, file_mime
from tests.test_app_support import make_window, send, wait_reply  # noqa: F401

pytestmark = pytest.mark.slow


def chips(w) -> list[AttachmentChip]:
    return w.composer._chips()


def test_a_pdf_is_one_chip_and_its_pages_are_pictures(make_window, qtbot, tmp_path):
    w = make_window(family="qwen2_vl", max_new_tokens=6)
    done = []
    w.bridge.turnDone.connect(done.append)
    pdf = make_pdf(tmp_path / "report.pdf", 10, size=(120, 160))
    assert drop(w.composer.edit.viewport(), file_mime(pdf))
    [chip] = chips(w)
    assert chip.attachment.document.pages == 10 and chip.title.text() == "report.pdf · 10 pages"
    assert chip.pages.text() == "1-10" and chip.note.text() == "all pages"
    assert not chip.attachment.thumb.isNull()
    send(qtbot, w, "What do these pages say?")
    wait_reply(qtbot, w)
    assert done and done[-1].stats.pictures_encoded == 10
    [msg] = [m for m in w.history.messages(w.controller.current_id) if m.role == "user"]
    assert len(msg.pictures) == 10 and all("#p=" in r for r in msg.pictures)
    item = w.messages.items()[0]
    assert len(item.pictures) == 10
    assert not read_scaled(item.pictures[3], 96).isNull()  # a page thumbnail, rendered
    assert len(list(w.history.pictures_dir.glob("*/*.pdf"))) == 1  # one stored file for all pages

    pdf.unlink()  # the second conversation needs neither the file nor the encoder
    w.new_chat()
    for r in msg.pictures[:1]:
        assert w.history.picture_ref(r).digest
    w.composer.take_files([str(w.history.picture_path(msg.pictures[0]))])
    send(qtbot, w, "What do these pages say?")
    wait_reply(qtbot, w)
    s = done[-1].stats
    assert s.pictures_encoded == 0 and s.encoder_loads == 0 and s.image_cache_hits == 10


def test_a_long_pdf_sends_the_chosen_pages_and_says_what_is_left_out(make_window, qtbot, tmp_path):
    w = make_window(load=False)
    pdf = make_pdf(tmp_path / "long.pdf", 30, size=(60, 80))
    w.composer.take_files([str(pdf)])
    [chip] = chips(w)
    assert chip.pages.text() == f"1-{DEFAULT_PAGES}"
    assert chip.note.text() == f"pages {DEFAULT_PAGES + 1}-30 left out"
    chip.pages.setText("2-3, 30")
    assert [r.rsplit("#", 1)[1] for r in chip.picture_refs(FrameSampling())] == ["p=1@144", "p=2@144", "p=29@144"]
    chip.pages.setText("0-40")
    assert "not within 1-30" in chip.note.text()


def test_settings_offer_the_pdf_text_and_set_video_sampling(make_window, qtbot, tmp_path):
    w = make_window(load=False)
    sent = []
    w.composer.sendRequested.connect(lambda text, refs: sent.append((text, refs)))
    w.composer.set_ready(True)
    w.composer.set_document_options(True, FrameSampling(fps=2, max_frames=3))
    w.composer.take_files([str(make_pdf(tmp_path / "notes.pdf", 3)), str(make_video(tmp_path / "clip.mp4", 3))])
    pdf_chip, video_chip = chips(w)
    assert video_chip.note.text() == "3 frames (2 a second, at most 3)"
    pdf_chip.pages.setText("2")
    send(qtbot, w, "Compare them")
    text, refs = sent[-1]
    assert "[notes.pdf, page 2]\nPage 2" in text and text.endswith("Compare them")
    assert len(refs) == 1 + 3 and sum("#t=" in r for r in refs) == 3


def test_a_bad_pdf_is_one_line_and_the_draft_stays(make_window, qtbot, tmp_path):
    w = make_window(load=False)
    w.composer.edit.setFocus()
    qtbot.keyClicks(w.composer.edit, "my draft")
    assert drop(w.composer.edit.viewport(), file_mime(make_encrypted_pdf(tmp_path / "locked.pdf")))
    assert w.composer.problem.isVisible()
    assert w.composer.problem.text() == "locked.pdf is password-protected; save an unprotected copy to attach it"
    assert w.composer.text() == "my draft" and not chips(w)
    assert not list(w.history.pictures_dir.glob("*/*"))


def test_paste_a_pdf_and_a_video_as_files(make_window, qtbot, tmp_path):
    from PySide6.QtCore import QMimeData, QUrl
    from PySide6.QtGui import QGuiApplication

    w = make_window(load=False)
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(make_pdf(tmp_path / "p.pdf", 2))),
                  QUrl.fromLocalFile(str(make_video(tmp_path / "v.mp4", 1)))])
    QGuiApplication.clipboard().setMimeData(mime)
    w.composer.edit.setFocus()
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_V, Qt.KeyboardModifier.ControlModifier)
    assert [c.title.text() for c in chips(w)] == ["p.pdf · 2 pages", "v.mp4 · 0:01"]
    assert w.composer.text() == ""
    # the clipboard owns that mime data now: emptied here, not while Qt shuts down (a crash at exit)
    QGuiApplication.clipboard().clear()


def test_the_history_keeps_a_document_its_pages_name(tmp_path):
    """A page in a stored message names its document's stored copy: the engine gets the same page
    key as `ask --file`, and the stored PDF is never purged as an orphan while a message holds it."""
    from app.history import History
    from engine.pictures import parts
    from engine.pictures.document import Document

    pdf = make_pdf(tmp_path / "kept.pdf", 4)
    doc = Document.of_file(pdf)
    h = History(tmp_path / "data")
    try:
        stored = h.add_file(pdf, doc.digest)
        cid = h.create_conversation().id
        refs = [parts.page_name(stored, i, 144) for i in (0, 3)]
        h.add_message(cid, "user", "two pages", refs)
        assert [h.picture_ref(r).digest for r in refs] == [doc.page(0).digest, doc.page(3).digest]
        assert h.purge_orphan_pictures() == 0 and h.picture_path(refs[0]).is_file()
        with pytest.raises(ValueError):
            h.add_message(cid, "user", "bad", [stored + "#p=x@144"])
    finally:
        h.close()
