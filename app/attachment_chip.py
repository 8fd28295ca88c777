"""One attachment in the composer: a picture's thumbnail, or a document as one chip with its page
count and a page range (by default every page up to DEFAULT_PAGES, saying which are left out), or
a video with its length and the frames its sampling takes. `picture_refs` says what is sent."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QPixmap
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QLineEdit, QToolButton, QVBoxLayout

from engine.pictures import parts
from engine.pictures.document import DEFAULT_DPI
from engine.pictures.picture_budget import parse_ranges, ranges_text
from engine.pictures.video import FrameSampling, clock

from .picture_intake import Attachment

# Pages sent when the person chooses none: about what a 2B model's 32k context holds at the
# processor's page size, with room left for the conversation (engine/pictures/picture_budget.py
# refuses a turn that still does not fit, naming what would).
DEFAULT_PAGES = 20


class AttachmentChip(QFrame):
    removeRequested = Signal(object)  # the chip

    def __init__(self, att: Attachment, parent=None):
        super().__init__(parent)
        self.attachment = att
        self.setObjectName("attachmentChip")
        self.setToolTip(att.name)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(4, 4, 2, 4)
        lay.setSpacing(2)
        self.picture = QLabel()
        self.picture.setFixedSize(56, 56)
        self.picture.setAlignment(Qt.AlignmentFlag.AlignCenter)
        pm = QPixmap.fromImage(att.thumb)
        if not pm.isNull():
            self.picture.setPixmap(pm.scaled(56, 56, Qt.AspectRatioMode.KeepAspectRatio,
                                             Qt.TransformationMode.SmoothTransformation))
        lay.addWidget(self.picture)
        self.pages: QLineEdit | None = None  # a document's page range
        self.title: QLabel | None = None  # a document's or video's name and size
        self.note = QLabel()  # pages left out, frames taken
        self.note.setObjectName("attachmentNote")
        if att.document is not None or att.video is not None:
            lay.addLayout(self._media_column(att))
        self.remove = QToolButton()
        self.remove.setText("×")
        self.remove.setToolTip(f"Remove {att.name}")
        self.remove.setAutoRaise(True)
        self.remove.clicked.connect(lambda: self.removeRequested.emit(self))
        lay.addWidget(self.remove, 0, Qt.AlignmentFlag.AlignTop)

    def _media_column(self, att: Attachment) -> QVBoxLayout:
        col = QVBoxLayout()
        col.setSpacing(1)
        if att.document is not None:
            n = att.document.pages
            self.title = QLabel(f"{att.name} · {n} page{'s' if n != 1 else ''}")
            self.pages = QLineEdit(att.page_range or (f"1-{min(n, DEFAULT_PAGES)}" if n > 1 else "1"))
            self.pages.setObjectName("pageRange")
            self.pages.setToolTip("Pages to send, like 1-3, 6")
            self.pages.setMaximumWidth(110)
            self.pages.textChanged.connect(self._range_changed)
            col.addWidget(self.title)
            col.addWidget(self.pages)
            self._range_changed(self.pages.text())
        elif att.video is not None:
            self.title = QLabel(f"{att.name} · {clock(att.video.duration)}")
            col.addWidget(self.title)
        col.addWidget(self.note)
        return col

    def _range_changed(self, text: str) -> None:
        self.attachment.page_range = text
        doc = self.attachment.document
        if doc is None:
            return
        try:
            chosen = parse_ranges(text, doc.pages)
        except ValueError as exc:
            self.note.setText(str(exc))
            return
        left = [i for i in range(doc.pages) if i not in chosen]
        self.note.setText(f"pages {ranges_text(left)} left out" if left else "all pages")

    def set_sampling(self, sampling: FrameSampling) -> None:
        if self.attachment.video is not None:
            n = len(sampling.times(self.attachment.video.duration))
            self.note.setText(f"{n} frame{'s' if n != 1 else ''} ({sampling.fps:g} a second, at most "
                              f"{sampling.max_frames})")

    def chosen_pages(self) -> list[int]:
        """The document's pages to send (ValueError with one sentence when the range is not
        valid); none for a picture or a video."""
        doc = self.attachment.document
        if doc is None or self.pages is None:
            return []
        try:
            return parse_ranges(self.pages.text(), doc.pages)
        except ValueError as exc:
            raise ValueError(f"{self.attachment.name}: {exc}") from None

    def picture_refs(self, sampling: FrameSampling) -> list[str]:
        """The history refs this chip sends: the picture, the chosen pages or the sampled frames."""
        att = self.attachment
        if att.document is not None:
            return [parts.page_name(att.ref, i, DEFAULT_DPI) for i in self.chosen_pages()]
        if att.video is not None:
            return [parts.frame_name(att.ref, t, sampling) for t in sampling.times(att.video.duration)]
        return [att.ref]

    def document_text(self) -> str:
        doc = self.attachment.document
        return doc.text(self.chosen_pages(), self.attachment.name) if doc is not None else ""


class ReadingChip(QFrame):
    """A PDF or video still being read off the UI thread (app/media_read.py): its name, and a
    remove button that cancels the read. `chat`: the draft it belongs to."""
    removeRequested = Signal(object)  # the chip

    def __init__(self, token: int, name: str, chat: str | None, parent=None):
        super().__init__(parent)
        self.token, self.name, self.chat = token, name, chat
        self.setObjectName("attachmentChip")
        self.setToolTip(name)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(8, 4, 2, 4)
        lay.setSpacing(2)
        self.label = QLabel(f"Reading {name}…")
        self.label.setObjectName("attachmentNote")
        lay.addWidget(self.label)
        self.remove = QToolButton()
        self.remove.setText("×")
        self.remove.setToolTip(f"Stop reading {name}")
        self.remove.setAutoRaise(True)
        self.remove.clicked.connect(lambda: self.removeRequested.emit(self))
        lay.addWidget(self.remove, 0, Qt.AlignmentFlag.AlignTop)
