"""Pictures into the composer: real drop events (file URLs, image data), paste, refusals."""

from __future__ import annotations

import base64
from pathlib import Path

import blake3
from PIL import Image
from PySide6.QtCore import QMimeData, Qt
from PySide6.QtGui import QGuiApplication, QImage

from tests.fixtures.pictures import make_broken_picture, make_not_a_picture, make_picture, picture_bytes
from tests.helpers.window import drop, file_mime, free_port, ok, post, send, settings, wait_reply


def refs(w):
    return [a.ref for a in w.composer.attachments()]


def test_drop_files_on_the_composer_then_send(make_window, qtbot, tmp_path):
    w = make_window(max_new_tokens=8)
    a = make_picture(tmp_path / "a.png", seed=1)
    b = make_picture(tmp_path / "b.jpg", seed=2, fmt="JPEG")
    assert drop(w.composer.edit.viewport(), file_mime(a, b))
    assert refs(w) == [
        blake3.blake3(a.read_bytes()).hexdigest() + ".png",
        blake3.blake3(b.read_bytes()).hexdigest() + ".jpg",
    ]
    assert w.composer.text() == ""  # the file URLs did not land in the text
    assert drop(w.composer.edit.viewport(), file_mime(a))  # the same picture again: no duplicate
    assert len(refs(w)) == 2
    send(qtbot, w, "two pictures")
    wait_reply(qtbot, w)
    assert len(w.messages.items()[0].pictures) == 2
    assert w.history.messages(w.controller.current_id)[0].pictures == tuple(
        refs_sent := [
            blake3.blake3(a.read_bytes()).hexdigest() + ".png",
            blake3.blake3(b.read_bytes()).hexdigest() + ".jpg",
        ]
    )
    assert len(refs_sent) == 2


def test_drop_on_the_conversation_goes_to_the_composer(make_window, tmp_path):
    w = make_window(load=False)
    a = make_picture(tmp_path / "a.png", seed=7)
    assert drop(w.chat.viewport(), file_mime(a))
    assert len(refs(w)) == 1


def test_drop_image_data_from_another_app(make_window):
    w = make_window(load=False)
    img = QImage(40, 30, QImage.Format.Format_RGB32)
    img.fill(Qt.GlobalColor.darkCyan)
    mime = QMimeData()
    mime.setImageData(img)
    assert drop(w.composer.edit.viewport(), mime)
    [att] = w.composer.attachments()
    assert att.ref.endswith(".png") and Path(att.path).is_file()
    stored = QImage(att.path)
    assert (stored.width(), stored.height()) == (40, 30)


def test_drop_raw_png_bytes_keeps_them_as_they_are(make_window):
    w = make_window(load=False)
    data = picture_bytes(11)
    mime = QMimeData()
    mime.setData("image/png", data)
    assert drop(w.composer.edit.viewport(), mime)
    [att] = w.composer.attachments()
    assert Path(att.path).read_bytes() == data


def test_paste_a_picture(make_window, qtbot):
    w = make_window(load=False)
    img = QImage(32, 32, QImage.Format.Format_RGB32)
    img.fill(Qt.GlobalColor.red)
    QGuiApplication.clipboard().setImage(img)
    w.composer.edit.setFocus()
    qtbot.keyClicks(w.composer.edit, "look:")
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_V, Qt.KeyboardModifier.ControlModifier)
    assert len(w.composer.attachments()) == 1
    assert w.composer.text() == "look:"
    QGuiApplication.clipboard().setText(" plain text")
    qtbot.keyClick(w.composer.edit, Qt.Key.Key_V, Qt.KeyboardModifier.ControlModifier)
    assert w.composer.text() == "look: plain text" and len(w.composer.attachments()) == 1


def test_refused_files_explain_themselves_and_keep_the_draft(make_window, qtbot, tmp_path):
    w = make_window(load=False)
    good = make_picture(tmp_path / "good.png", seed=4)
    w.composer.edit.setFocus()
    qtbot.keyClicks(w.composer.edit, "my draft")
    assert drop(w.composer.edit.viewport(), file_mime(good))

    pdf = make_not_a_picture(tmp_path / "report.pdf")
    broken = make_broken_picture(tmp_path / "cut.png", size=(200, 150))
    huge = tmp_path / "huge.png"
    Image.new("1", (10000, 8000)).save(huge)
    assert drop(w.composer.edit.viewport(), file_mime(pdf, broken, huge))
    qtbot.waitUntil(lambda: not w.composer.reading(), timeout=10_000)  # a PDF is read off the UI thread

    problem = w.composer.problem.text()
    assert w.composer.problem.isVisible()
    assert "report.pdf is a damaged PDF" in problem  # a PDF is read now (its pages are pictures): this one is not one
    assert "cut.png is a damaged picture" in problem
    assert "huge.png is too large (10000×8000" in problem
    assert w.composer.text() == "my draft"
    assert [a.name for a in w.composer.attachments()] == ["good.png"]
    # nothing of the refused files was stored
    assert len(list(w.history.pictures_dir.glob("*/*"))) == 1


def test_remove_an_attachment(make_window, qtbot, tmp_path):
    w = make_window(load=False)
    a = make_picture(tmp_path / "a.png", seed=1)
    b = make_picture(tmp_path / "b.png", seed=2)
    w.composer.take_files([str(a), str(b)])
    chip = w.composer.chips.itemAt(0).widget()
    qtbot.mouseClick(chip.remove, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: [x.name for x in w.composer.attachments()] == ["b.png"], timeout=2000)


def test_chat_thumbnails_decode_off_the_ui_thread(qtbot, tmp_path):
    from app.composer.thumbnails import ThumbnailCache

    cache = ThumbnailCache()
    big = make_picture(tmp_path / "big.jpg", seed=3, size=(3000, 2000), fmt="JPEG")
    with qtbot.waitSignal(cache.ready, timeout=10000):
        assert cache.get(str(big), 112) is None  # not decoded yet: the view paints a placeholder
    pm = cache.get(str(big), 112)
    assert pm.width() == 112 and 74 <= pm.height() <= 75
    broken = make_broken_picture(tmp_path / "cut.png")
    with qtbot.waitSignal(cache.ready, timeout=10000):
        cache.get(str(broken), 112)
    assert cache.get(str(broken), 112).isNull()  # unreadable: drawn as "picture missing"


def test_a_picture_from_the_window_and_from_the_api_is_one_file(make_window, qtbot, tmp_path):
    """One picture store: the API finds the window's copy (one file) and the engine's cache entry
    (one encode), and the API's size cap can never take a picture a conversation keeps."""

    w = make_window(max_new_tokens=3)
    pic = make_picture(tmp_path / "shared.png", seed=7)
    assert drop(w.composer.edit.viewport(), file_mime(pic))
    send(qtbot, w, "What is it?")
    wait_reply(qtbot, w)
    name = w.history.messages(w.controller.current_id)[0].pictures[0]
    port = free_port()
    assert ok(qtbot, w, settings(qtbot, w, True, port=port))
    url = "data:image/png;base64," + base64.b64encode(pic.read_bytes()).decode()
    reply = post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        {
            "max_tokens": 2,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": url}},
                        {"type": "text", "text": "And this?"},
                    ],
                }
            ],
        },
    )
    assert reply["usage"]["parley"]["image_cache_hits"] == 1 and reply["usage"]["parley"]["pictures_encoded"] == 0
    assert [path for _, path in w.history.pictures.names()] == [w.history.picture_path(name)]
    assert w.history.picture_path(name).read_bytes() == pic.read_bytes()
    assert not w.history.pictures.is_transient(name)  # still the conversation's, whatever the API's cap
    assert not (w.data_dir / "api-pictures").exists()


def test_a_file_of_no_kind_parley_takes_names_pdfs_and_videos_too(make_window, qtbot, tmp_path):
    """Issue 40: the refusal listed only picture formats, though PDFs and videos are taken."""
    w = make_window(load=False)
    notes = tmp_path / "notes.txt"
    notes.write_text("shopping: eggs, milk\n")
    assert drop(w.composer.edit.viewport(), file_mime(notes))
    problem = w.composer.problem.text()
    assert w.composer.problem.isVisible() and "notes.txt is not a picture, PDF or video" in problem
    assert "PNG" in problem and "PDF" in problem and "MP4" in problem
    assert w.composer.attachments() == []
