"""The window's intake against hostile files (issue #37): a PDF bomb, a scan-bomb JPEG and a clip
of giant frames dropped together are each refused with one line; PDFs and videos are read off the
UI thread, whose event loop keeps turning meanwhile; a 5 GB clip is refused before it is hashed."""

from __future__ import annotations

import threading
import time

import pytest
from PySide6.QtCore import QTimer

from app.composer.composer import Composer
from app.composer.picture_intake import PictureIntake, PictureRejected
from app.history.history import History
from engine.pictures import pdfium_process, video
from tests.fixtures.documents import make_video
from tests.fixtures.hostile import jpeg_scan_bomb, pdf_bomb


def test_hostile_files_are_refused_off_the_ui_thread(qtbot, tmp_path, monkeypatch):
    old = pdfium_process.set_limits(pdfium_process.PdfLimits(memory_bytes=200 << 20, page_s=5, probe_s=10))
    try:
        intake = PictureIntake(History(tmp_path / "data"))
        composer = Composer(intake)
        qtbot.addWidget(composer)
        (tmp_path / "scans.jpg").write_bytes(jpeg_scan_bomb())
        monkeypatch.setattr(video, "MAX_PIXELS", 64 * 48 - 1)  # this clip's frames are over the budget
        files = [pdf_bomb(tmp_path / "bomb.pdf", 64), tmp_path / "scans.jpg", make_video(tmp_path / "giant.mp4")]
        said: list[str] = []
        real_show = composer.show_problem
        monkeypatch.setattr(composer, "show_problem", lambda m: said.append(m) or real_show(m))
        threads = []
        real = intake.from_media
        monkeypatch.setattr(intake, "from_media", lambda *a: threads.append(threading.current_thread()) or real(*a))
        gaps, last = [0.0], [time.perf_counter()]

        def tick():  # the event loop's longest pause while the files are read
            now = time.perf_counter()
            gaps.append(now - last[0])
            last[0] = now

        timer = QTimer()
        timer.timeout.connect(tick)
        timer.start(10)
        composer.take_files([str(f) for f in files])
        qtbot.waitUntil(lambda: not composer.reading(), timeout=30_000)
        timer.stop()
        assert len(threads) == 2 and threading.main_thread() not in threads  # the PDF and the clip
        problem = "; ".join(said)
        assert all(name in problem for name in ("bomb.pdf, page 1", "scans.jpg", "giant.mp4")), problem
        assert "Traceback" not in problem
        assert composer.attachments() == []
        assert max(gaps) < 1.0, max(gaps)  # generous: the reads themselves took seconds, off this thread
    finally:
        pdfium_process.set_limits(old)


def test_a_picture_slow_to_decode_is_read_off_the_ui_thread(tmp_path):
    from app.composer.picture_intake import slow_to_decode
    from tests.fixtures.hostile import progressive_jpeg
    from tests.fixtures.pictures import make_picture

    intake = PictureIntake(History(tmp_path / "data"))
    small = make_picture(tmp_path / "small.png", 1)
    (tmp_path / "big.jpg").write_bytes(progressive_jpeg((1000, 1000)))  # 1 MP × 10 scans
    assert not intake.is_media(small) and not slow_to_decode(small)
    assert intake.is_media(tmp_path / "big.jpg")
    assert intake.from_media(tmp_path / "big.jpg").name == "big.jpg"  # what the reader's thread calls


def test_a_clip_too_big_is_refused_before_it_is_hashed(tmp_path, monkeypatch):
    big = tmp_path / "huge.mp4"
    with open(big, "wb") as f:  # sparse: 5 GB on paper, nothing on disk
        f.truncate(5 << 30)
    hashed = []
    monkeypatch.setattr(video, "file_digest", lambda *a: hashed.append(a) or "0" * 64)
    intake = PictureIntake(History(tmp_path / "data"))
    with pytest.raises(PictureRejected, match="huge.mp4 is too big"):
        intake.from_media(big)
    assert hashed == []
