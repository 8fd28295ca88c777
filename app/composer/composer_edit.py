"""The composer's text box: Enter sends, Shift+Enter starts a new line; pictures, PDFs and
videos pasted or dropped into the text go to the composer (mimeOffered), not into the text."""

from __future__ import annotations

from PySide6.QtCore import QMimeData, QSize, Qt, Signal
from PySide6.QtGui import QKeyEvent, QKeySequence
from PySide6.QtWidgets import QPlainTextEdit, QSizePolicy

from .picture_intake import mime_has_pictures

# the longest that fits on the box's one line is shown; a cut hint reads as a broken window
PLACEHOLDERS = ("Message — Enter to send, Shift+Enter for a new line", "Message — Enter to send", "Message")


class ComposerEdit(QPlainTextEdit):
    submit = Signal()
    mimeOffered = Signal(QMimeData, str)  # pictures pasted or dropped into the text
    nothingToUndo = Signal()  # Ctrl+Z with no typing left to undo: the window's last action is undone

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("composerEdit")
        self.setPlaceholderText(PLACEHOLDERS[0])
        self.setTabChangesFocus(True)
        self.document().contentsChanged.connect(self.updateGeometry)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def keyPressEvent(self, e: QKeyEvent) -> None:
        if e.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (e.modifiers() & Qt.KeyboardModifier.ShiftModifier):
            self.submit.emit()
            return
        if e.matches(QKeySequence.StandardKey.Undo) and not self.document().isUndoAvailable():
            self.nothingToUndo.emit()
            return
        super().keyPressEvent(e)

    def resizeEvent(self, e) -> None:
        super().resizeEvent(e)
        room = self.viewport().width() - 2 * int(self.document().documentMargin())
        fits = [p for p in PLACEHOLDERS if self.fontMetrics().horizontalAdvance(p) <= room]
        self.setPlaceholderText(fits[0] if fits else PLACEHOLDERS[-1])

    def sizeHint(self) -> QSize:
        fm = self.fontMetrics()
        lines = max(1, min(8, int(self.document().size().height())))
        m = self.contentsMargins()
        h = lines * fm.lineSpacing() + 2 * int(self.document().documentMargin()) + m.top() + m.bottom() + 4
        return QSize(super().sizeHint().width(), h)

    def minimumSizeHint(self) -> QSize:  # the scroll area's default is ~5 lines tall
        return QSize(100, self.sizeHint().height())

    def canInsertFromMimeData(self, source: QMimeData) -> bool:
        return mime_has_pictures(source) or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:
        if mime_has_pictures(source):
            self.mimeOffered.emit(source, "pasted")
            return
        super().insertFromMimeData(source)

    def dropEvent(self, e) -> None:
        if mime_has_pictures(e.mimeData()):
            self.mimeOffered.emit(e.mimeData(), "dropped")
            e.acceptProposedAction()
            return
        super().dropEvent(e)
