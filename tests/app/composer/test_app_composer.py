"""The composer's rough edges from issue 27: the attach dialog offers exactly the formats the refusal
names, file dialogs open in the person's folders (not wherever the app was started), and each chat
keeps its own draft."""

from __future__ import annotations

import re
from pathlib import Path

from PIL import Image
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QFileDialog

from tests.fixtures.pictures import make_not_a_picture, make_picture


def test_attach_dialog_and_refusal_name_the_same_formats(make_window, tmp_path):
    from app.composer.composer import picture_filter
    from engine.pictures.file import PICTURE_TYPES, PictureError, check

    offered = set(re.findall(r"\*(\.\w+)", picture_filter().split(";;")[1]))
    assert picture_filter().split(";;")[1].startswith("Pictures (")
    assert offered == {ext for t in PICTURE_TYPES for ext in t.extensions}
    bad = make_not_a_picture(tmp_path / "report.pdf")
    try:
        check(bad.read_bytes(), "report.pdf")
    except PictureError as exc:
        refusal = str(exc)
    names = re.search(r"\((.*)\)", refusal).group(1)
    assert re.split(r", | or ", names) == [t.name for t in PICTURE_TYPES]
    assert "TIFF" in names  # the dialog offered .tif / .tiff while the refusal left TIFF out

    # every offered format is taken, through the window as a person attaches it
    w = make_window(load=False)
    picture = Image.new("RGB", (64, 48), (200, 40, 40))
    for t in PICTURE_TYPES:
        path = tmp_path / f"picture{t.extensions[-1]}"
        picture.save(path)
        w.composer.take_files([str(path)])
        assert not w.composer.problem.isVisible(), (t.name, w.composer.problem.text())
    assert len(w.composer.attachments()) == len(PICTURE_TYPES)


def _dialog_folder(trigger, choose: Path | None = None) -> str:
    """Open a file dialog with `trigger`, read the folder it shows; cancel it, or pick `choose` in it."""
    seen = []

    def look():
        dlg = QApplication.activeModalWidget()
        if not isinstance(dlg, QFileDialog):
            return QTimer.singleShot(20, look)
        seen.append(dlg.directory().absolutePath())
        if choose is None:
            return dlg.reject()
        dlg.setDirectory(str(choose.parent))
        dlg.selectFile(choose.name)
        dlg.accept()

    QTimer.singleShot(0, look)
    trigger()
    return seen[0]


def test_file_dialogs_open_in_the_home_folder_then_where_the_last_picture_was(make_window, tmp_path, monkeypatch):
    from app.models.model_picker import ModelPicker

    home = tmp_path / "home"
    (home / "Pictures").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(Path(__file__).resolve().parents[3])  # as `make run` starts it: in the checkout
    w = make_window(load=False)
    assert _dialog_folder(w.composer.choose_files) == str(home / "Pictures")
    picker = ModelPicker([], w.bridge.check_model_folder, parent=w)
    assert _dialog_folder(picker.choose_folder) == str(home)

    elsewhere = tmp_path / "holiday"
    elsewhere.mkdir()
    pic = make_picture(elsewhere / "beach.png", seed=2)
    _dialog_folder(w.composer.choose_files, choose=pic)
    assert [a.name for a in w.composer.attachments()] == ["beach.png"]
    assert _dialog_folder(w.composer.choose_files) == str(elsewhere)


def test_each_chat_keeps_its_own_draft(make_window, qtbot, tmp_path):
    from tests.helpers.window import send, wait_reply

    w = make_window(max_new_tokens=4)
    send(qtbot, w, "first chat")
    wait_reply(qtbot, w)
    first = w.controller.current_id
    pic = make_picture(tmp_path / "a.png", seed=1)
    qtbot.keyClicks(w.composer.edit, "half a thought for the first chat")
    w.composer.take_files([str(pic)])

    w.new_chat()
    assert w.composer.text() == "" and w.composer.attachments() == []  # the draft stayed behind
    send(qtbot, w, "second chat")
    wait_reply(qtbot, w)
    second = w.controller.current_id
    qtbot.keyClicks(w.composer.edit, "draft of the second")

    w.sidebar.conversationActivated.emit(first)
    assert w.controller.current_id == first
    assert w.composer.text() == "half a thought for the first chat"
    assert [a.name for a in w.composer.attachments()] == ["a.png"]
    w.sidebar.conversationActivated.emit(second)
    assert w.composer.text() == "draft of the second" and w.composer.attachments() == []
