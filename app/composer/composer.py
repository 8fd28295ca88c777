"""The composer: multi-line draft, attached pictures, send / stop, inline problems.

Enter sends, Shift+Enter starts a new line. Pictures, PDFs and videos arrive by the attach
button, by drag and drop (files or image data), or by paste; each is checked and stored on
arrival (a PDF or a video is read off the UI thread, its chip saying so and Send waiting
for it; then a PDF is one chip with its page count and a page range; a video one chip with its
frames). A refused one (an encrypted PDF, a damaged or huge picture, a clip without pictures) is
reported in a line above the draft, and the draft and the other attachments stay as they were.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QMimeData, QSize, QStandardPaths, Qt, QTimer, QUrl, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from engine.pictures.file import PICTURE_TYPES, PictureError
from engine.pictures.video import VIDEO_EXTENSIONS, FrameSampling

from ..history import StoredPicture
from ..icons import icon
from .attachment_chip import AttachmentChip, PageBudget, ReadingChip
from .composer_edit import ComposerEdit
from .media_read import MediaRead, MediaReader
from .picture_intake import Attachment, PictureIntake, mime_has_pictures


def picture_filter() -> str:
    """The attach dialog's filter: the formats the picture check names, and nothing else."""
    patterns = " ".join(f"*{ext}" for t in PICTURE_TYPES for ext in t.extensions)
    videos = " ".join(f"*{ext}" for ext in VIDEO_EXTENSIONS)
    return (
        f"Pictures, PDFs and videos ({patterns} *.pdf {videos});;Pictures ({patterns});;PDF documents (*.pdf);;"
        f"Videos ({videos});;All files (*)"
    )


def pictures_folder() -> str:
    """Where a person keeps pictures: the system's Pictures folder, else home (never the folder the
    app was started from)."""
    folder = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.PicturesLocation)
    return folder if folder and Path(folder).is_dir() else str(Path.home())


@dataclass
class Draft:
    """What a chat's composer held when the person left that chat."""

    text: str
    attachments: list[Attachment]


class Composer(QFrame):
    sendRequested = Signal(str, list)  # text, pictures (app/history.py: StoredPicture)
    stopRequested = Signal()
    editCancelled = Signal()
    picturesAdded = Signal(list)  # picture refs newly in the draft (the engine may get ready for them)

    def __init__(self, intake: PictureIntake, parent=None):
        super().__init__(parent)
        self.intake = intake
        self.setObjectName("composer")
        self.setAcceptDrops(True)
        self.editing_message_id: int | None = None
        self.document_text = False  # settings: a PDF's own text goes with its pages
        self.frame_sampling = FrameSampling()
        self.page_budget = PageBudget()  # the loaded model's context and page cost: a PDF's default pages
        self._generating = False
        self._ready = True
        self._not_ready_why = ""
        self.reader = MediaReader(intake, self)
        self.reader.finished.connect(self._media_read)
        self._reads: dict[int, ReadingChip] = {}  # token -> its chip, in whichever draft it belongs to
        self._drafts: dict[str, Draft] = {}  # chat id -> the draft left there
        self._draft_chat: str | None = None  # the chat the composer's content belongs to
        self._last_folder: str | None = None  # where the last attached picture came from

        outer = QVBoxLayout(self)
        outer.setContentsMargins(10, 6, 10, 10)
        outer.setSpacing(4)

        self.banner = QWidget()
        bl = QHBoxLayout(self.banner)
        bl.setContentsMargins(0, 0, 0, 0)
        self.banner_label = QLabel("Editing a message — the conversation continues from here")
        self.banner_label.setObjectName("mutedLabel")
        cancel = QToolButton()
        cancel.setText("Cancel")
        cancel.setAutoRaise(True)
        cancel.clicked.connect(self.cancel_edit)
        bl.addWidget(self.banner_label, 1)
        bl.addWidget(cancel)
        self.banner.hide()
        outer.addWidget(self.banner)

        self.problem = QLabel()
        self.problem.setObjectName("problemLabel")
        self.problem.setWordWrap(True)
        self.problem.hide()
        self._problem_timer = QTimer(self)
        self._problem_timer.setSingleShot(True)
        self._problem_timer.timeout.connect(self.problem.hide)
        outer.addWidget(self.problem)

        self.chips_row = QWidget()
        self.chips = QHBoxLayout(self.chips_row)
        self.chips.setContentsMargins(0, 0, 0, 0)
        self.chips.addStretch(1)
        self.chips_row.hide()
        outer.addWidget(self.chips_row)

        row = QHBoxLayout()
        row.setSpacing(6)
        self.attach = QToolButton()
        self.attach.setObjectName("attachButton")
        self.attach.setIcon(icon("attach"))
        self.attach.setIconSize(QSize(20, 20))
        self.attach.setToolTip("Attach pictures")
        self.attach.setAutoRaise(True)
        self.attach.clicked.connect(self.choose_files)
        self.edit = ComposerEdit()
        self.edit.submit.connect(self.submit)
        self.edit.mimeOffered.connect(self.take_mime)
        self.send = QToolButton()
        self.send.setObjectName("sendButton")
        self.send.setIconSize(QSize(20, 20))
        self.send.setAutoRaise(True)
        self.send.clicked.connect(self._send_or_stop)
        row.addWidget(self.attach, 0, Qt.AlignmentFlag.AlignBottom)
        row.addWidget(self.edit, 1)
        row.addWidget(self.send, 0, Qt.AlignmentFlag.AlignBottom)
        outer.addLayout(row)
        self._update_send()

    # ------------------------------------------------------------ state from outside

    def set_generating(self, generating: bool) -> None:
        self._generating = generating
        self._update_send()

    def set_ready(self, ready: bool, why: str = "") -> None:
        self._ready = ready
        self._not_ready_why = why
        self._update_send()

    def _update_send(self) -> None:
        if self._generating:
            self.send.setIcon(icon("stop"))
            self.send.setToolTip("Stop (Esc)")
            self.send.setEnabled(True)
        else:
            reading = self.reading()
            self.send.setIcon(icon("send"))
            self.send.setEnabled(self._ready and not reading)
            if not self._ready:
                self.send.setToolTip(self._not_ready_why)
            elif reading:
                self.send.setToolTip(f"Waiting for {', '.join(reading)} to be read")
            else:
                self.send.setToolTip("Send (Enter)")

    def attachments(self) -> list[Attachment]:
        return [chip.attachment for chip in self._chips()]

    def text(self) -> str:
        return self.edit.toPlainText()

    def set_text(self, text: str) -> None:
        """The draft's text replaced (an example question), the cursor at its end, ready to send."""
        self.edit.setPlainText(text)
        self.edit.moveCursor(self.edit.textCursor().MoveOperation.End)
        self.edit.setFocus()

    def reading_chips(self) -> list[ReadingChip]:
        """This draft's PDFs and videos still being read."""
        return [c for c in self._reads.values() if c.chat == self._draft_chat]

    def reading(self) -> list[str]:
        return [c.name for c in self.reading_chips()]

    # ------------------------------------------------------------ attachments

    def add_attachments(self, atts: list[Attachment], at: int | None = None) -> None:
        """Chips for `atts` (each file once), at the end or from index `at` of the chips row."""
        have = {a.ref for a in self.attachments()}
        added = []
        for att in atts:
            if att.ref in have:
                continue
            have.add(att.ref)
            added.append(att.ref)
            chip = AttachmentChip(att, self.page_budget)
            chip.set_sampling(self.frame_sampling)
            chip.removeRequested.connect(self._remove_chip)
            self.chips.insertWidget(self.chips.count() - 1 if at is None else at + len(added) - 1, chip)
        self._show_chips_row()
        if added:
            self.picturesAdded.emit(added)

    def _show_chips_row(self) -> None:
        self.chips_row.setVisible(bool(self.attachments() or self.reading()))

    def set_picture_notes(self, notes: dict[str, str]) -> None:
        """A line per attached picture (by ref) for its tooltip: cached, or new and to be encoded."""
        for chip in self._chip_widgets():
            if isinstance(chip, AttachmentChip):
                note = notes.get(chip.attachment.ref)
                chip.setToolTip(f"{chip.attachment.name}\n{note}" if note else chip.attachment.name)

    def _remove_chip(self, chip: AttachmentChip | ReadingChip) -> None:
        if isinstance(chip, ReadingChip):  # removed while being read: the read is cancelled
            self._reads.pop(chip.token, None)
            self.reader.cancel(chip.token)
        self.chips.removeWidget(chip)
        chip.deleteLater()
        self._show_chips_row()
        self._update_send()

    def clear_attachments(self) -> None:
        for chip in self._chip_widgets():  # a list: removing a chip changes the row
            if isinstance(chip, (AttachmentChip, ReadingChip)):
                self._remove_chip(chip)

    def take_mime(self, mime: QMimeData, verb: str = "dropped") -> None:
        taken = self.intake.from_mime(mime, verb)
        self.add_attachments(taken.found)
        for path in taken.media:  # hashed, probed and copied off the UI thread
            chip = ReadingChip(self.reader.start(path), path.name or str(path), self._draft_chat)
            chip.removeRequested.connect(self._remove_chip)
            self._reads[chip.token] = chip
            self.chips.insertWidget(self.chips.count() - 1, chip)
        self._show_chips_row()
        self._update_send()
        if taken.errors:
            self.show_problem("; ".join(taken.errors))
        elif taken.found or taken.media:
            self.problem.hide()

    def _media_read(self, result: MediaRead) -> None:
        """A PDF or video was read: its chip takes the reading chip's place (in the draft of the
        chat it was dropped in, wherever the person is now); a refused one is one line."""
        chip = self._reads.pop(result.token, None)
        if chip is None:
            return
        here = chip.chat == self._draft_chat
        at = self.chips.indexOf(chip) if here else -1
        if at >= 0:
            self.chips.removeWidget(chip)
        chip.deleteLater()
        if result.attachment is None:  # joins the drop's other refusals when they still show
            self.show_problem(f"{self.problem.text()}; {result.error}" if self.problem.isVisible() else result.error)
        elif here:
            self.add_attachments([result.attachment], at if at >= 0 else None)
        elif chip.chat is not None:
            draft = self._drafts.setdefault(chip.chat, Draft("", []))
            if all(a.ref != result.attachment.ref for a in draft.attachments):
                draft.attachments.append(result.attachment)
        self._show_chips_row()
        self._update_send()

    def take_files(self, paths: list[str]) -> None:
        mime = QMimeData()
        mime.setUrls([QUrl.fromLocalFile(p) for p in paths])
        self.take_mime(mime, "chosen")

    def choose_files(self) -> None:
        folder = self._last_folder if self._last_folder and Path(self._last_folder).is_dir() else pictures_folder()
        paths, _ = QFileDialog.getOpenFileNames(self, "Attach pictures, PDFs or videos", folder, picture_filter())
        if paths:
            self._last_folder = str(Path(paths[0]).parent)
            self.take_files(paths)

    def show_problem(self, message: str) -> None:
        self.problem.setText(message)
        self.problem.show()
        self._problem_timer.start(12000)

    # ------------------------------------------------------------ a draft per chat

    def switch_draft(self, conversation_id: str | None) -> None:
        """Keep what is typed and attached with the chat being left; bring back the draft of the
        chat opened. A draft typed while no chat was open belongs to the chat made for it."""
        left = self._draft_chat
        if conversation_id == left:
            return
        self._draft_chat = conversation_id
        if left is None:
            for chip in self._reads.values():  # still being read: now this chat's
                chip.chat = conversation_id if chip.chat is None else chip.chat
            return
        text, atts = self.text(), self.attachments()
        if text or atts:
            self._drafts[left] = Draft(text, atts)
        else:
            self._drafts.pop(left, None)
        draft = self._drafts.pop(conversation_id, None) if conversation_id else None
        self.edit.setPlainText(draft.text if draft else "")
        self.edit.moveCursor(self.edit.textCursor().MoveOperation.End)
        for chip in self._reads.values():  # a read goes on; its chip waits with its draft
            if chip.chat == left:
                self.chips.removeWidget(chip)
                chip.hide()
        self.clear_attachments()
        self.add_attachments(draft.attachments if draft else [])
        for chip in self.reading_chips():
            self.chips.insertWidget(self.chips.count() - 1, chip)
            chip.show()
        self._show_chips_row()
        self._update_send()
        self.problem.hide()

    # ------------------------------------------------------------ send / edit

    def submit(self) -> None:
        if self._generating or not self._ready:
            return
        if self.reading():  # Send waits for the draft's PDFs and videos
            self.show_problem(f"{', '.join(self.reading())} is still being read; send when its chip is ready")
            return
        text = self.edit.toPlainText().strip()
        refs: list[StoredPicture] = []
        texts: list[str] = []
        try:  # a document sends its chosen pages, a video its sampled frames
            for chip in self._chips():
                refs.extend(chip.pictures(self.frame_sampling))
                if self.document_text:
                    texts.append(chip.document_text())
        except (ValueError, PictureError) as exc:  # a bad page range, a document gone: the draft stays
            self.show_problem(str(exc))
            return
        if not text and not refs:
            return
        offered = "\n\n".join(t for t in texts if t)
        self.sendRequested.emit(f"{offered}\n\n{text}" if offered else text, refs)

    def set_document_options(self, document_text: bool, sampling: FrameSampling) -> None:
        """Settings: whether a PDF's text goes with its pages, and how videos are sampled."""
        self.document_text = document_text
        self.frame_sampling = sampling
        for chip in self._chips():
            chip.set_sampling(sampling)

    def set_page_budget(self, budget: PageBudget) -> None:
        """A model was loaded: PDFs default to the pages its context holds (unknown: DEFAULT_PAGES)."""
        self.page_budget = budget
        for chip in self._chips():
            chip.set_budget(budget)

    def _chips(self) -> list[AttachmentChip]:
        return [w for w in self._chip_widgets() if isinstance(w, AttachmentChip)]

    def _chip_widgets(self) -> list[QWidget]:
        """The widgets in the chips row, in order (its stretch is an item without one)."""
        items = (self.chips.itemAt(i) for i in range(self.chips.count()))
        return [w for item in items if item is not None and (w := item.widget()) is not None]

    def _send_or_stop(self) -> None:
        if self._generating:
            self.stopRequested.emit()
        else:
            self.submit()

    def clear(self) -> None:
        self.edit.clear()
        self.clear_attachments()
        self.problem.hide()
        self.editing_message_id = None
        self.banner.hide()

    def begin_edit(self, message_id: int, text: str, atts: list[Attachment]) -> None:
        """Edit a sent message: sending it adds a new version; the old one keeps its replies."""
        self.clear()
        self.editing_message_id = message_id
        self.banner_label.setText("Editing a message — sending it adds a new version; the old one stays (‹ ›)")
        self.edit.setPlainText(text)
        self.add_attachments(atts)
        self.banner.show()
        self.edit.setFocus()
        self.edit.moveCursor(self.edit.textCursor().MoveOperation.End)

    def cancel_edit(self) -> None:
        if self.editing_message_id is not None:
            self.clear()
            self.editCancelled.emit()

    # ------------------------------------------------------------ drops on the frame

    def dragEnterEvent(self, e) -> None:
        if mime_has_pictures(e.mimeData()):
            e.acceptProposedAction()

    def dragMoveEvent(self, e) -> None:
        if mime_has_pictures(e.mimeData()):
            e.acceptProposedAction()

    def dropEvent(self, e) -> None:
        if mime_has_pictures(e.mimeData()):
            self.take_mime(e.mimeData(), "dropped")
            e.acceptProposedAction()
