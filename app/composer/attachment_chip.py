"""One attachment in the composer: a picture's thumbnail, or a document as one chip with its page
count and a page range (by default every page that fits the loaded model's context, saying which
are left out), or a video with its length and the frames its sampling takes. `picture_refs` says
what is sent."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QPixmap
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QLineEdit, QToolButton, QVBoxLayout

from engine.pictures import parts
from engine.pictures.document import DEFAULT_DPI
from engine.pictures.picture_budget import BudgetChoice, fit, parse_ranges, ranges_text
from engine.pictures.video import FrameSampling, clock

from ..history import StoredPicture
from .picture_intake import Attachment

# Pages sent when the person chooses none and the context is unknown (a remote engine): about
# what a 2B model's 32k context holds at the processor's page size, with room left for the
# conversation (the engine refuses a turn that still does not fit, naming what would).
DEFAULT_PAGES = 20


@dataclass(frozen=True)
class PageBudget:
    """What the loaded model takes, from its ModelReady: its context length and about what one
    page costs at the render dpi. None when unknown (a remote engine, no model yet)."""

    context_tokens: int | None = None
    page_tokens: int | None = None

    def default_pages(self, count: int, name: str = "") -> BudgetChoice:
        """The pages sent unless the person chooses: every page that fits the context (at least
        the first), else the first DEFAULT_PAGES."""
        if not (self.context_tokens and self.page_tokens):
            n = min(count, DEFAULT_PAGES)
            return BudgetChoice(tuple(range(n)), tuple(range(n, count)), None)
        choice = fit(list(range(count)), self.page_tokens, self.context_tokens, name=name)
        if choice.kept:
            return choice
        return BudgetChoice((0,), tuple(range(1, count)), choice.line)


class AttachmentChip(QFrame):
    removeRequested = Signal(object)  # the chip

    def __init__(self, att: Attachment, budget: PageBudget = PageBudget(), parent=None):
        super().__init__(parent)
        self.attachment = att
        self.budget = budget
        self._default_range = ""  # the range the budget chose, while the person has not typed one
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
            self.picture.setPixmap(
                pm.scaled(56, 56, Qt.AspectRatioMode.KeepAspectRatio, Qt.TransformationMode.SmoothTransformation)
            )
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
            self._default_range = self._budget_range()
            self.pages = QLineEdit(att.page_range or self._default_range)
            self.pages.setObjectName("pageRange")
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

    def _budget_range(self) -> str:
        doc = self.attachment.document
        assert doc is not None
        return ranges_text(self.budget.default_pages(doc.pages).kept)

    def set_budget(self, budget: PageBudget) -> None:
        """A model was loaded: a range the person left as it was becomes the pages that fit it."""
        self.budget = budget
        if self.pages is None:
            return
        untouched = self.pages.text() == self._default_range
        self._default_range = self._budget_range()
        if untouched:
            self.pages.setText(self._default_range)
        self._range_changed(self.pages.text())

    def _range_changed(self, text: str) -> None:
        # "" while it is the budget's default: a draft brought back follows the model loaded then
        self.attachment.page_range = "" if text == self._default_range else text
        doc = self.attachment.document
        if doc is None or self.pages is None:
            return
        line = self.budget.default_pages(doc.pages, self.attachment.name).line
        self.pages.setToolTip("Pages to send, like 1-3, 6" + (f"\n{line}" if line else ""))
        try:
            chosen = parse_ranges(text, doc.pages)
        except ValueError as exc:
            self.note.setText(str(exc))
            return
        left = [i for i in range(doc.pages) if i not in chosen]
        fits = (
            f" (about {len(self.budget.default_pages(doc.pages).kept)} fit the model's context)"
            if left and text == self._default_range and line
            else ""
        )
        self.note.setText(f"pages {ranges_text(left)} left out{fits}" if left else "all pages")

    def set_sampling(self, sampling: FrameSampling) -> None:
        if self.attachment.video is not None:
            n = len(sampling.times(self.attachment.video.duration))
            self.note.setText(
                f"{n} frame{'s' if n != 1 else ''} ({sampling.fps:g} a second, at most {sampling.max_frames})"
            )

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

    def pictures(self, sampling: FrameSampling) -> list[StoredPicture]:
        """What this chip sends: its refs, each with the name of the file they came from."""
        return [StoredPicture.parse(r, self.attachment.source) for r in self.picture_refs(sampling)]

    def document_text(self) -> str:
        doc = self.attachment.document
        return doc.text(self.chosen_pages(), self.attachment.name) if doc is not None else ""


class ReadingChip(QFrame):
    """A PDF or video still being read off the UI thread (app/composer/media_read.py): its name, and a
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
