"""PDFs and videos in the window: a dropped PDF is one chip with its page count and a page range
(all pages up to a limit by default, saying which are left out); the chat shows page thumbnails;
a second conversation on the same pages encodes nothing; settings choose the PDF's text and the
video sampling; a bad file is one line and the draft stays."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import pytest
from PySide6.QtCore import Qt

from app.composer.attachment_chip import DEFAULT_PAGES, AttachmentChip
from app.composer.thumbnails import read_scaled
from engine.pictures.video import FrameSampling
from tests.fixtures.documents import make_encrypted_pdf, make_pdf, make_video
from tests.helpers.window import drop, file_mime, send, wait_reply

pytestmark = pytest.mark.slow


def chips(w) -> list[AttachmentChip]:
    return w.composer._chips()


def test_a_pdf_is_one_chip_and_its_pages_are_pictures(make_window, qtbot, tmp_path):
    w = make_window(family="qwen2_vl", max_new_tokens=6)
    done = []
    w.bridge.turnDone.connect(done.append)
    pdf = make_pdf(tmp_path / "report.pdf", 10, size=(120, 160))
    assert drop(w.composer.edit.viewport(), file_mime(pdf))
    wait_read(qtbot, w)
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
    wait_read(qtbot, w)
    send(qtbot, w, "What do these pages say?")
    wait_reply(qtbot, w)
    s = done[-1].stats
    assert s.pictures_encoded == 0 and s.encoder_loads == 0 and s.image_cache_hits == 10


def test_a_pdf_page_shows_its_file_name_in_the_chat_and_tells_the_model(make_window, qtbot, tmp_path):
    """A sent PDF page is captioned "report.pdf, page 2" under its thumbnail (its tooltip too),
    the model is told the same just before the page, and both stay after the app restarts (the
    history keeps the name; the stored copy is named by its digest)."""
    data = tmp_path / "shared-data"
    w = make_window(data_dir=data, max_new_tokens=4)
    turns = []
    submit = w.bridge.submit
    w.bridge.submit = lambda turn: (turns.append(turn), submit(turn))[1]  # what the engine is sent
    w.composer.take_files([str(make_pdf(tmp_path / "report.pdf", 3, size=(60, 80)))])
    wait_read(qtbot, w)
    chips(w)[0].pages.setText("2-3")
    send(qtbot, w, "What is on these pages?")
    wait_reply(qtbot, w)
    expected = ["report.pdf, page 2", "report.pdf, page 3"]
    assert [p.caption for p in turns[-1].messages[-1].images] == expected
    assert shown_captions(w) == expected
    # editing the message keeps its pages' names (its chips come back from the history)
    w._message_action("edit", w.messages.items()[0].id)
    send(qtbot, w, " Briefly.")
    wait_reply(qtbot, w)
    assert w.messages.items()[0].text == "What is on these pages? Briefly."
    assert [p.caption for p in turns[-1].messages[-1].images] == expected
    assert shown_captions(w) == expected
    cid = w.controller.current_id
    w.close()

    w2 = make_window(data_dir=data, load=False)
    assert w2.controller.current_id == cid
    assert shown_captions(w2) == expected
    turns2 = []
    submit2 = w2.bridge.submit
    w2.bridge.submit = lambda turn: (turns2.append(turn), submit2(turn))[1]
    w2.controller.regenerate()  # the next turn tells the model the same, word for word
    assert [p.caption for p in turns2[-1].messages[-1].images] == expected


def shown_captions(w) -> list[str]:
    """The captions drawn under the first message's thumbnails, each checked to lie under its
    thumbnail inside the bubble, and the tooltip over each picture naming it."""
    delegate, index = w.chat.delegate, w.messages.index(0, 0)
    geo = delegate.geometry(index)
    captions = []
    for (text, rect), (_path, thumb) in zip(geo.captions, geo.thumbs, strict=True):
        assert rect.top() > thumb.bottom() and rect.left() == thumb.left()
        assert geo.bubble.contains(rect.bottomRight().toPointF()) and rect.bottom() < geo.doc_origin.y()
        assert delegate.picture_tip_at(index, thumb.center()).startswith(text)
        captions.append(text)
    return captions


def test_a_long_pdf_sends_the_chosen_pages_and_says_what_is_left_out(make_window, qtbot, tmp_path):
    w = make_window(load=False)
    pdf = make_pdf(tmp_path / "long.pdf", 30, size=(60, 80))
    w.composer.take_files([str(pdf)])
    wait_read(qtbot, w)
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
    wait_read(qtbot, w)
    pdf_chip, video_chip = chips(w)
    assert video_chip.note.text() == "3 frames (2 a second, at most 3)"
    pdf_chip.pages.setText("2")
    send(qtbot, w, "Compare them")
    text, refs = sent[-1]
    assert "[notes.pdf, page 2]\nPage 2" in text and text.endswith("Compare them")
    assert len(refs) == 1 + 3 and sum("#t=" in p.ref for p in refs) == 3
    assert {p.name for p in refs} == {"notes.pdf", "clip.mp4"}  # each picture with its file's name


def test_a_bad_pdf_is_one_line_and_the_draft_stays(make_window, qtbot, tmp_path):
    w = make_window(load=False)
    w.composer.edit.setFocus()
    qtbot.keyClicks(w.composer.edit, "my draft")
    assert drop(w.composer.edit.viewport(), file_mime(make_encrypted_pdf(tmp_path / "locked.pdf")))
    wait_read(qtbot, w)
    assert w.composer.problem.isVisible()
    assert w.composer.problem.text() == "locked.pdf is password-protected; save an unprotected copy to attach it"
    assert w.composer.text() == "my draft" and not chips(w)
    assert not list(w.history.pictures_dir.glob("*/*"))


def test_paste_a_pdf_and_a_video_as_files(make_window, qtbot, tmp_path):
    from PySide6.QtCore import QMimeData, QUrl
    from PySide6.QtGui import QGuiApplication

    w = make_window(load=False)
    mime = QMimeData()
    mime.setUrls(
        [
            QUrl.fromLocalFile(str(make_pdf(tmp_path / "p.pdf", 2))),
            QUrl.fromLocalFile(str(make_video(tmp_path / "v.mp4", 1))),
        ]
    )
    QGuiApplication.clipboard().setMimeData(mime)
    w.composer.edit.setFocus()
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_V, Qt.KeyboardModifier.ControlModifier)
    wait_read(qtbot, w)
    assert [c.title.text() for c in chips(w)] == ["p.pdf · 2 pages", "v.mp4 · 0:01"]
    assert w.composer.text() == ""
    # the clipboard owns that mime data now: emptied here, not while Qt shuts down (a crash at exit)
    QGuiApplication.clipboard().clear()


def test_the_history_keeps_a_document_its_pages_name(tmp_path):
    """A page in a stored message names its document's stored copy: the engine gets the same page
    key as `ask --file`, and the stored PDF is never purged as an orphan while a message holds it."""
    from app.history.history import History
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


def wait_read(qtbot, w) -> None:
    """PDFs and videos are read (hashed, copied, probed) off the UI thread: wait for their chips."""
    qtbot.waitUntil(lambda: not w.composer.reading(), timeout=10_000)


@contextmanager
def pdfium_held(seconds: float = 8):
    """Hold the engine's own PDFium lock (its child process takes one call at a time), so a PDF
    being read surely waits in flight (real code, no stand-in). A watchdog frees it after
    `seconds`: a UI thread that reads the PDF itself would otherwise wait forever; what it yields
    is non-empty when the watchdog had to."""
    from engine.pictures.pdfium_process import pdfium

    lock = pdfium()._lock
    lock.acquire()
    freed: list[bool] = []

    def free() -> None:
        freed.append(True)
        lock.release()

    watchdog = threading.Timer(seconds, free)
    watchdog.start()
    try:
        yield freed
    finally:
        watchdog.cancel()
        watchdog.join()
        if not freed:
            lock.release()


def test_a_clip_is_read_off_the_ui_thread_and_send_waits(make_window, qtbot, tmp_path):
    """While a PDF is being read the window keeps handling events, its chip says so and Send waits.
    The read is held on the engine's own PDFium lock (real code, no stand-in) so it is surely in
    flight; reading it on the UI thread would block the drop itself."""
    from PySide6.QtCore import QTimer

    w = make_window(load=False)
    w.composer.set_ready(True)
    pdf = make_pdf(tmp_path / "report.pdf", 3)
    w.composer.edit.setFocus()
    qtbot.keyClicks(w.composer.edit, "my draft")
    with pdfium_held() as freed:
        assert drop(w.composer.edit.viewport(), file_mime(pdf))
        assert not freed, "the drop waited for the PDF to be read on the UI thread"
        assert w.composer.reading() == ["report.pdf"]
        assert w.composer.reading_chips()[0].label.text() == "Reading report.pdf…"
        assert not w.composer.send.isEnabled() and "report.pdf" in w.composer.send.toolTip()
        assert not w.composer.attachments()
        timer = QTimer()
        timer.setSingleShot(True)
        with qtbot.waitSignal(timer.timeout, timeout=2000):  # the event loop runs meanwhile
            timer.start(10)
        qtbot.keyClick(w.composer.edit, Qt.Key.Key_Return)  # Enter does not send a half-read draft
        assert w.composer.text() == "my draft" and w.composer.reading() == ["report.pdf"]
    wait_read(qtbot, w)
    [chip] = chips(w)
    assert chip.title.text() == "report.pdf · 3 pages" and not w.composer.reading_chips()
    assert w.composer.send.isEnabled() and w.composer.text() == "my draft"


def test_a_bad_clip_read_off_the_ui_thread_is_one_line(make_window, qtbot, tmp_path):
    w = make_window(load=False)
    qtbot.keyClicks(w.composer.edit, "keep me")
    bad = tmp_path / "clip.mp4"
    bad.write_bytes(b"\x00" * 4096)
    w.composer.take_files([str(bad)])
    wait_read(qtbot, w)
    assert w.composer.problem.isVisible() and w.composer.problem.text().startswith("clip.mp4 ")
    assert not chips(w) and not w.composer.reading_chips() and w.composer.text() == "keep me"


def test_removing_a_chip_while_it_is_read_cancels_it(make_window, qtbot, tmp_path):
    w = make_window(load=False)
    w.composer.set_ready(True)
    pdf = make_pdf(tmp_path / "gone.pdf", 2)
    with pdfium_held() as freed:  # the read waits on PDFium while the chip is removed
        w.composer.take_files([str(pdf)])
        assert not freed, "the PDF was read on the UI thread"
        [reading] = w.composer.reading_chips()
        qtbot.mouseClick(reading.remove, Qt.MouseButton.LeftButton)
        assert not w.composer.reading() and w.composer.send.isEnabled()
    qtbot.waitUntil(lambda: w.composer.reader.in_flight() == 0, timeout=10_000)
    assert not chips(w) and not w.composer.problem.isVisible()
    w.composer.take_files([str(pdf)])  # attached again, it is read again
    wait_read(qtbot, w)
    assert [c.title.text() for c in chips(w)] == ["gone.pdf · 2 pages"]


def test_a_clip_read_while_the_person_changes_chat_lands_in_its_own_draft(make_window, qtbot, tmp_path):
    w = make_window(load=False)
    c = w.composer
    c.switch_draft("first")
    pdf = make_pdf(tmp_path / "mine.pdf", 2)
    with pdfium_held() as freed:
        c.take_files([str(pdf)])
        assert not freed and c.reading() == ["mine.pdf"]
        c.switch_draft("second")
        assert not c.reading() and not chips(w) and c.send.isEnabled() == c._ready
    qtbot.waitUntil(lambda: c.reader.in_flight() == 0, timeout=10_000)
    assert not chips(w)  # not in the chat the person is in now
    c.switch_draft("first")
    assert [ch.title.text() for ch in chips(w)] == ["mine.pdf · 2 pages"]


def test_a_pdf_defaults_to_the_pages_the_models_context_holds(make_window, qtbot, tmp_path):
    """The window learns the loaded model's context and what a page costs from its ModelReady; a
    PDF's chip then defaults to the pages that fit and says which were left out. A range the
    person typed stays theirs; unknown (no model, a remote engine): the first DEFAULT_PAGES."""
    from app.composer.attachment_chip import PageBudget

    w = make_window(family="qwen2_vl", max_new_tokens=4)
    ready = []
    w.bridge.modelReady.connect(ready.append)
    w.load_model(w.model_path)  # again, to see the event the window sized its budget by
    qtbot.waitUntil(lambda: bool(ready) and w.model_ready, timeout=60_000)
    budget = w.composer.page_budget
    assert budget == PageBudget(ready[-1].context_tokens, ready[-1].page_tokens)
    assert budget.context_tokens and budget.page_tokens and budget.page_tokens > 0

    # a context of 1,000 tokens at 100 a page: 7 pages (3/4 of it; the reply and the text need the rest)
    w.composer.set_page_budget(PageBudget(1000, 100))
    w.composer.take_files(
        [
            str(make_pdf(tmp_path / "long.pdf", 12, size=(60, 80))),
            str(make_pdf(tmp_path / "typed.pdf", 12, size=(60, 80), seed=1)),
        ]
    )
    wait_read(qtbot, w)
    chip, typed = chips(w)
    assert chip.pages.text() == "1-7"
    assert chip.note.text() == "pages 8-12 left out (about 7 fit the model's context)"
    assert "left out: pages 8-12" in chip.pages.toolTip()
    typed.pages.setText("2-3")
    w.composer.set_page_budget(PageBudget(2000, 100))  # another model: an untouched range follows it
    assert chip.pages.text() == "1-12" and chip.note.text() == "all pages"
    assert typed.pages.text() == "2-3"
    w.composer.set_page_budget(PageBudget())  # unknown (a remote engine): the first DEFAULT_PAGES
    assert chip.pages.text() == "1-12" and typed.pages.text() == "2-3"
    w.composer.set_page_budget(PageBudget(1000, 2000))  # not even one page fits: the first, and the engine says why
    assert chip.pages.text() == "1" and chip.note.text().startswith("pages 2-12 left out")
    w.composer.set_page_budget(PageBudget(1000, 100))
    w.composer.switch_draft("a")
    w.composer.switch_draft("b")  # the draft waits with chat "a" while another model loads
    w.composer.set_page_budget(PageBudget(2000, 100))
    w.composer.switch_draft("a")
    assert [c.pages.text() for c in chips(w)] == ["1-12", "2-3"]
