"""Hostile documents, frames and pictures (issue #37), each made here: every one is refused with
one sentence naming the file (and the page or time), before it can take the process, gigabytes
or minutes; the process and its PDF reader go on serving honest files."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from engine.api.errors import ApiError, without_paths
from engine.pictures import document, pdfium_process, video
from engine.pictures.attach import attach
from engine.pictures.file import PictureError, check, jpeg_scans
from engine.pictures.picture_budget import parse_ranges
from engine.pictures.video import FrameSampling, decode_frame
from engine.protocol.events import Message
from tests.fixtures.documents import make_pdf, make_video
from tests.fixtures.hostile import (
    giant_frame_clip,
    jpeg_scan_bomb,
    one_key_frame_clip,
    pdf_bomb,
    pdf_count_lies,
    pdf_deep_tree,
    pdf_tree_cycle,
    progressive_jpeg,
)
from tests.helpers.engine_helpers import ask, expect_done, open_engine


@pytest.fixture
def small_limits():
    """A PDF reader with 200 MB and 5 s a page (the defaults: 1.5 GB, 20 s), restored after."""
    old = pdfium_process.set_limits(pdfium_process.PdfLimits(memory_bytes=200 << 20, page_s=5, probe_s=10))
    yield pdfium_process.pdfium().limits
    pdfium_process.set_limits(old)


ROOT = Path(__file__).resolve().parents[3]


def _one_line(err: pytest.ExceptionInfo, *words: str) -> str:
    msg = str(err.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    return msg


def test_a_pdf_bomb_stops_in_the_reader_process_not_ours(tmp_path, small_limits):
    """A page inflating to 64 MB of path operators (~1 GB parsed at the default limits' scale):
    the PDFium child is stopped at its cap, the file refused with one line naming the page, and
    the next (honest) PDF is read by a fresh child."""
    bomb = pdf_bomb(tmp_path / "bomb.pdf", 64)
    assert bomb.stat().st_size < 200_000
    fine = make_pdf(tmp_path / "fine.pdf", 2)
    attach(fine)
    starts = pdfium_process.pdfium().starts
    with pytest.raises(PictureError) as err:
        attach(bomb)
    _one_line(err, "bomb.pdf, page 1", "Parley stopped it")
    doc = attach(fine).document
    assert doc.page(1).picture().size == (400, 520)
    assert pdfium_process.pdfium().starts == starts + 1  # the stopped child was replaced


def test_a_page_over_its_time_is_stopped(tmp_path):
    # 64 MB of operators take 11 s to parse here: far past 0.5 s on any machine; memory is no bound here
    old = pdfium_process.set_limits(pdfium_process.PdfLimits(memory_bytes=8 << 30, page_s=0.5, probe_s=10))
    try:
        with pytest.raises(PictureError) as err:
            attach(pdf_bomb(tmp_path / "slow.pdf", 64))
        _one_line(err, "slow.pdf, page 1", "longer than 0.5 s")
    finally:
        pdfium_process.set_limits(old)


@pytest.mark.parametrize(
    "maker, words",
    [
        (pdf_tree_cycle, ("loop.pdf",)),
        (pdf_count_lies, ("loop.pdf, page 2", "cannot be read")),
        (pdf_deep_tree, ("loop.pdf",)),
    ],
)
def test_pages_that_do_not_load_are_refused_at_attach(tmp_path, maker, words):
    with pytest.raises(PictureError) as err:
        attach(maker(tmp_path / "loop.pdf"))
    _one_line(err, *words)


def test_the_api_answers_a_page_that_does_not_load_with_a_400(tmp_path):
    from engine.api.files import Upload, store_file_upload
    from engine.pictures.store import PictureStore

    store = PictureStore(tmp_path / "data" / "pictures")
    data = pdf_count_lies(tmp_path / "lies.pdf").read_bytes()
    with pytest.raises(ApiError) as err:
        url_part = Upload("", "messages[0].content[0].file.file_data", "file")
        store_file_upload(store, data, "application/pdf", url_part)
    body = err.value.body()["error"]
    assert err.value.status == 400 and body["code"] == "invalid_file"
    assert body["message"].startswith("The PDF, page 2 cannot be read") and str(tmp_path) not in json.dumps(body)


def test_api_messages_never_carry_a_server_path():
    said = ApiError(400, "Picture not found: /srv/parley/data/pictures/ab/abc.png; also C:\\Users\\bob\\x.mp4").body()
    assert said["error"]["message"] == "Picture not found: abc.png; also x.mp4"
    assert without_paths("see http://host/a/b and/or 1/2") == "see http://host/a/b and/or 1/2"


def test_video_frames_get_the_picture_budget_before_decoding(tmp_path, monkeypatch):
    """The frame size comes from the container; a frame over the budget is refused at attach
    and never decoded (the budget lowered here so a small clip is over it)."""
    clip = make_video(tmp_path / "huge.mp4", seconds=1, fps=5, size=(64, 48))
    monkeypatch.setattr(video, "MAX_PIXELS", 64 * 48 - 1)
    decoded = []
    monkeypatch.setattr(video.av.container.InputContainer, "decode", lambda *a, **k: decoded.append(1) or iter(()))
    with pytest.raises(PictureError) as err:
        attach(clip)
    _one_line(err, "huge.mp4", "64×48")
    with pytest.raises(PictureError):
        decode_frame(str(clip), 0.0, "huge.mp4 at 0:00")
    assert decoded == []


def test_a_giant_frame_is_refused_from_the_container_without_ffmpeg_decoding_it(tmp_path):
    """Probing a stream decodes its first frame: FFmpeg gets the picture budget itself, so a frame
    over it is refused before its pixels exist (a child process's peak memory shows it: the frame
    decoded would add 64 MB)."""
    clip = giant_frame_clip(tmp_path / "giant.mp4", (8001, 8001))  # 64.02 megapixels, grey
    child = (
        "import resource, sys\n"
        "from engine.pictures.video import Video, PictureError\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n"
        "    Video.of_file(sys.argv[1])\n"
        "except PictureError as exc:\n"
        "    print(exc)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", child, str(clip)], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.splitlines()
    assert out[0] == (
        "giant.mp4 does not say its frame size, or its frames are over 64 megapixels; Parley cannot decode it safely"
    )
    assert int(out[1]) < 16, f"the check grew the process by {out[1]} MB"
    with pytest.raises(PictureError) as err:
        decode_frame(str(clip), 0.0, "giant.mp4 at 0:00")  # a stored reference to it: the same refusal
    _one_line(err, "giant.mp4 at 0:00", "64 megapixels")


def test_a_clip_with_one_key_frame_is_refused_at_attach(tmp_path, monkeypatch):
    clip = one_key_frame_clip(tmp_path / "one-key.mp4", seconds=20, fps=10)
    monkeypatch.setattr(video, "MAX_DECODE_FRAMES", 40)
    att = attach(clip)  # its first frame is its key frame: that decodes
    with pytest.raises(PictureError) as err:
        att.refs(sampling=FrameSampling(fps=0.5, max_frames=4))
    _one_line(err, "one-key.mp4 at 0:0", "key frame")
    # a frame asked for anyway (a stored reference) stops after MAX_DECODE_FRAMES
    with pytest.raises(PictureError) as err:
        decode_frame(str(clip), 15.0, "one-key.mp4 at 0:15")
    _one_line(err, "one-key.mp4 at 0:15", "more than 40 frames")
    # near the key frame is fine
    assert decode_frame(str(clip), 3.0, "one-key.mp4 at 0:03").size == (64, 48)


def test_a_progressive_jpeg_of_a_thousand_scans_is_refused_before_decoding():
    bomb = jpeg_scan_bomb()
    assert jpeg_scans(bomb) > 1000
    with pytest.raises(PictureError) as err:
        check(bomb, "scans.jpg")
    _one_line(err, "scans.jpg", "scans")
    check(progressive_jpeg(), "honest.jpg")  # Pillow's own progressive file: 10 scans


def test_the_page_range_parser_is_linear_and_keeps_order():
    assert parse_ranges("3, 1-4, 2, 9-10, 4", 10) == [2, 0, 1, 3, 8, 9]
    assert parse_ranges("1-1000," * 18_000, 1000) == list(range(1000))  # took ~90 s when quadratic
    with pytest.raises(ValueError, match="not within 1-10"):
        parse_ranges("1-3, 4-11", 10)


def test_the_image_cache_files_are_private(tmp_path):
    import torch

    from engine.pictures.span import PictureKey
    from engine.vision.disk_cache import DiskImageCache
    from engine.vision.entry import PictureEntry

    os.umask(0o022)
    cache = DiskImageCache(tmp_path / "image-cache", 1 << 30)
    entry = PictureEntry(key=PictureKey("k" * 8), replacement="<i>", n_tokens=64, features=torch.ones(64, 256))
    assert cache.put(entry)  # 64 KB: diskcache keeps it as a file of its own
    cache.close()
    modes = {p.relative_to(tmp_path): stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "image-cache").rglob("*")}
    assert any(str(p).endswith(".val") for p in modes)
    files = {p: m for p, m in modes.items() if (tmp_path / p).is_file()}
    assert "image-cache/cache.db" in {str(p) for p in files}
    assert all(m == 0o600 for m in files.values()), files
    assert all(m == 0o700 for p, m in modes.items() if (tmp_path / p).is_dir()), modes


@pytest.mark.slow
def test_the_context_is_checked_before_any_page_is_drawn(tmp_path, monkeypatch):
    """40 pages for a 600-token context: refused before a render, and the number said to fit is
    the number that does (that many pages run; one more is refused)."""
    import re

    from tests.fixtures.tiny_models import build_tiny_model

    model = build_tiny_model("qwen2_vl", tmp_path / "small", text={"max_position_embeddings": 600})
    pages = attach(make_pdf(tmp_path / "big.pdf", 40, size=(60, 80))).refs()
    engine = open_engine(model, tmp_path / "data")
    try:
        drawn = []
        real = document.render_page
        monkeypatch.setattr(document, "render_page", lambda *a: drawn.append(a) or real(*a))
        failed = ask(engine, "a", [Message("user", "Read all of it.", pages)], 4)
        assert drawn == [] and "\n" not in failed.message
        assert "context of 600 tokens" in failed.message and "left out: big.pdf, page" in failed.message
        fit = int(re.search(r"Only the first (\d+) fit", failed.message)[1])
        assert 5 < fit < 40
        done = expect_done(ask(engine, "b", [Message("user", "Read all of it.", pages[:fit])], 1))
        assert done.stats.prompt_tokens < 600
        over = ask(engine, "c", [Message("user", "Read all of it.", pages[: fit + 1])], 1)
        assert f"Only the first {fit} fit" in over.message
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_the_refusal_after_the_prompt_counts_what_fits(tmp_path):
    """Plain pictures (their size known only once read): the count said to fit is the count that
    does, captions and markers included (it once said 0 where 44 fit)."""
    import re

    from engine.pictures.ref import PictureRef
    from tests.fixtures.pictures import make_picture
    from tests.fixtures.tiny_models import build_tiny_model

    model = build_tiny_model("qwen2_vl", tmp_path / "small", text={"max_position_embeddings": 600})
    pics = [PictureRef.of_file(make_picture(tmp_path / f"p{i}.png", i, size=(112, 112))) for i in range(40)]
    engine = open_engine(model, tmp_path / "data")
    try:
        failed = ask(engine, "a", [Message("user", "Look.", pics)], 4)
        assert "context of 600 tokens" in failed.message and "\n" not in failed.message
        fit = int(re.search(r"Only the first (\d+) of this message's 40 pictures fit", failed.message)[1])
        assert 5 < fit < 40
        assert expect_done(ask(engine, "b", [Message("user", "Look.", pics[:fit])], 1)).stats.prompt_tokens < 600
        assert "context of 600" in ask(engine, "c", [Message("user", "Look.", pics[: fit + 1])], 1).message
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_serve_answers_a_pdf_bomb_with_a_400_and_serves_others_meanwhile(tiny_model, tmp_path, small_limits):
    """A bomb sent to the API while PDFium is busy (its lock held here, so the bomb surely waits
    in flight): another client's chat completes meanwhile; then the bomb is a 400 with one line,
    and the server still answers."""
    import concurrent.futures

    from tests.helpers.api_served import Served, data_url

    served = Served(tiny_model("llava"), tmp_path)
    try:
        bomb = pdf_bomb(tmp_path / "bomb.pdf", 64)
        body = json.dumps(
            {
                "model": served.model,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "file", "file": {"file_data": data_url(bomb, "application/pdf")}}],
                    }
                ],
            }
        )
        lock = pdfium_process.pdfium()._lock
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            lock.acquire()
            try:
                sent = pool.submit(served.raw, "POST", "/v1/chat/completions", body)
                light = served.chat([{"role": "user", "content": "Hello"}], max_tokens=2)
                assert light.usage.completion_tokens == 2 and not sent.done()
            finally:
                lock.release()
            status, _, answer = sent.result(timeout=120)
        err = json.loads(answer)["error"]
        assert status == 400 and err["code"] == "invalid_file" and "page 1" in err["message"]
        assert "\n" not in err["message"] and str(tmp_path) not in err["message"]
        assert served.chat([{"role": "user", "content": "Still there?"}], max_tokens=2).usage.completion_tokens == 2
    finally:
        served.close()
