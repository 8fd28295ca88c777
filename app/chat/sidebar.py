"""The sidebar: conversations newest first, search, new chat, rename, delete with undo; each row
marks where that chat's memory is (in memory, on SSD, restoring…, not cached: app/memory/memory_marks.py)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from PySide6.QtCore import QAbstractListModel, QModelIndex, QRect, QRectF, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QFont, QFontMetrics, QKeySequence, QPainter, QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListView,
    QMenu,
    QPushButton,
    QStyle,
    QStyledItemDelegate,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from engine.protocol.events import KVPlace

from ..history import History
from ..icons import icon
from ..memory import ChatMemoryMarks, Mark
from .message_delegate import mix

IdRole = Qt.ItemDataRole.UserRole + 1
SubtitleRole = Qt.ItemDataRole.UserRole + 2
MarkRole = Qt.ItemDataRole.UserRole + 3  # a memory_marks.Mark, or None (no model, or a server in use)
UNDO_SECONDS = 10
# a mark's dot: filled while the KV is in memory or on the SSD, a ring while it moves, hollow when gone
MARK_COLORS = {
    KVPlace.HOT: "#2fb171",
    KVPlace.SPILLING: "#2fb171",
    KVPlace.ON_SSD: "#4f7cff",
    KVPlace.RESTORING: "#4f7cff",
    KVPlace.NOT_CACHED: "",
}
MARK_FILLED = {KVPlace.HOT, KVPlace.ON_SSD}


@dataclass
class Row:
    id: str
    title: str
    subtitle: str
    message_id: int | None = None  # a search hit in a message: open the version that holds it


def when(ts: float, now: float | None = None) -> str:
    now = now or time.time()
    lt, ln = time.localtime(ts), time.localtime(now)
    if lt.tm_yday == ln.tm_yday and lt.tm_year == ln.tm_year:
        return time.strftime("Today %H:%M", lt)
    if now - ts < 2 * 86400 and (ln.tm_yday - lt.tm_yday) % 366 == 1:
        return "Yesterday"
    return time.strftime("%d %b %Y" if lt.tm_year != ln.tm_year else "%d %b", lt)


class ConversationListModel(QAbstractListModel):
    renameRequested = Signal(str, str)

    def __init__(self, marks: ChatMemoryMarks | None = None, parent=None):
        super().__init__(parent)
        self.rows: list[Row] = []
        self.marks = marks

    def rowCount(self, parent=QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self.rows)

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        r = self.rows[index.row()]
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.EditRole):
            return r.title
        mark = self.marks.mark(r.id) if self.marks is not None else None
        if role == Qt.ItemDataRole.ToolTipRole:
            return f"{r.title}\n{mark.tooltip}" if mark else r.title
        return {IdRole: r.id, SubtitleRole: r.subtitle, MarkRole: mark}.get(role)

    def flags(self, index):
        return super().flags(index) | Qt.ItemFlag.ItemIsEditable

    def setData(self, index, value, role=Qt.ItemDataRole.EditRole) -> bool:
        if role != Qt.ItemDataRole.EditRole or not str(value).strip():
            return False
        r = self.rows[index.row()]
        r.title = str(value).strip()
        self.dataChanged.emit(index, index)
        self.renameRequested.emit(r.id, r.title)
        return True

    def set_rows(self, rows: list[Row]) -> None:
        self.beginResetModel()
        self.rows = rows
        self.endResetModel()

    def row_of(self, conversation_id: str) -> int | None:
        for i, r in enumerate(self.rows):
            if r.id == conversation_id:
                return i
        return None


def elide_title(title: str, fm: QFontMetrics, width: int) -> str:
    """A title cut at its end, as a sentence is read ("What shape is on th…"); the number that
    tells two chats named alike apart stays ("What shape is on… (2)")."""
    if fm.horizontalAdvance(title) <= width:
        return title
    m = re.search(r" \(\d+\)$", title)
    suffix = m.group(0) if m else ""
    head = title[: len(title) - len(suffix)]
    return fm.elidedText(head, Qt.TextElideMode.ElideRight, max(0, width - fm.horizontalAdvance(suffix))) + suffix


class TwoLineDelegate(QStyledItemDelegate):
    def sizeHint(self, option, index) -> QSize:
        fm = QFontMetrics(option.font)
        return QSize(120, 2 * fm.height() + 14)  # as wide as the list: the title is elided to fit

    def paint(self, painter, option, index) -> None:
        self.initStyleOption(option, index)
        fm = QFontMetrics(option.font)
        pal = option.palette
        r = option.rect.adjusted(10, 6, -8, -6)
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        hovered = bool(option.state & QStyle.StateFlag.State_MouseOver)
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        if selected or hovered:
            base = pal.color(QPalette.ColorRole.Base)
            tint = pal.color(QPalette.ColorRole.Highlight)
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(mix(base, tint, 0.28 if selected else 0.10))
            painter.drawRoundedRect(QRectF(option.rect.adjusted(2, 1, -2, -1)), 6, 6)
        painter.setPen(pal.color(QPalette.ColorRole.Text))
        f = QFont(option.font)
        f.setBold(True)
        painter.setFont(f)
        title = elide_title(index.data() or "", QFontMetrics(f), r.width())
        painter.drawText(QRect(r.left(), r.top(), r.width(), fm.height()), Qt.AlignmentFlag.AlignLeft, title)
        painter.setFont(option.font)
        line = QRect(r.left(), r.top() + fm.height() + 2, r.width(), fm.height())
        mark = index.data(MarkRole)
        if mark is not None:  # the mark keeps its words; the date or search snippet gives way
            line.setRight(line.right() - self._paint_mark(painter, mark, line, fm, pal) - 8)
        painter.setPen(pal.color(QPalette.ColorRole.PlaceholderText))
        sub = fm.elidedText(index.data(SubtitleRole) or "", Qt.TextElideMode.ElideRight, max(0, line.width()))
        painter.drawText(line, Qt.AlignmentFlag.AlignLeft, sub)
        painter.restore()

    @staticmethod
    def _paint_mark(painter, mark: Mark, line: QRect, fm: QFontMetrics, pal) -> int:
        """A dot and the mark's words at the right end of `line`; returns the width they took."""
        words_w = fm.horizontalAdvance(mark.words)
        d = max(6, fm.height() // 2 - 1)
        width = d + 5 + words_w
        x = line.right() - width
        colour = (
            QColor(MARK_COLORS[mark.place])
            if MARK_COLORS[mark.place]
            else pal.color(QPalette.ColorRole.PlaceholderText)
        )
        dot = QRectF(x + 0.5, line.center().y() - d / 2 + 0.5, d - 1, d - 1)
        painter.setPen(colour)
        painter.setBrush(colour if mark.place in MARK_FILLED else Qt.BrushStyle.NoBrush)
        if mark.place in (KVPlace.SPILLING, KVPlace.RESTORING):  # half full: on its way
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawEllipse(dot)
            painter.setBrush(colour)
            painter.drawPie(dot, 90 * 16, 180 * 16 if mark.place == KVPlace.RESTORING else -180 * 16)
        else:
            painter.drawEllipse(dot)
        painter.setPen(colour if mark.place != KVPlace.NOT_CACHED else pal.color(QPalette.ColorRole.PlaceholderText))
        painter.drawText(
            QRect(x + d + 5, line.top(), words_w + 2, line.height()), Qt.AlignmentFlag.AlignLeft, mark.words
        )
        return width


class Sidebar(QWidget):
    conversationActivated = Signal(str)
    messageActivated = Signal(str, int)  # a search hit: conversation id, the message it was found in
    newRequested = Signal()
    deleteRequested = Signal(str)
    undoRequested = Signal(str)
    renameRequested = Signal(str, str)
    exportRequested = Signal(str)

    def __init__(self, history: History, marks: ChatMemoryMarks | None = None, parent=None):
        super().__init__(parent)
        self.history: History | None = history  # None once stopped
        self.setObjectName("sidebar")
        self.current_id: str | None = None
        self._deleted: list[tuple[str, str]] = []  # (id, title), newest last

        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 8, 8, 8)
        lay.setSpacing(6)
        top = QHBoxLayout()
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats")
        self.search.setClearButtonEnabled(True)
        self.new_button = QToolButton()
        self.new_button.setIcon(icon("new-chat"))
        self.new_button.setToolTip("New chat (Ctrl+N)")
        self.new_button.setAutoRaise(True)
        self.new_button.clicked.connect(self.newRequested)
        top.addWidget(self.search, 1)
        top.addWidget(self.new_button)
        lay.addLayout(top)

        self.model = ConversationListModel(marks, self)
        self.model.renameRequested.connect(self.renameRequested)
        self.list = QListView()
        self.list.setObjectName("conversationList")
        self.list.setModel(self.model)
        self.list.setItemDelegate(TwoLineDelegate(self.list))
        self.list.setEditTriggers(
            QAbstractItemView.EditTrigger.EditKeyPressed | QAbstractItemView.EditTrigger.DoubleClicked
        )
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        self.list.setFrameShape(QFrame.Shape.NoFrame)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # titles are elided
        self.list.clicked.connect(self._activate)
        self.list.activated.connect(self._activate)
        lay.addWidget(self.list, 1)
        if marks is not None:  # the rows' marks are read when painted: a repaint shows the news
            marks.changed.connect(self.list.viewport().update)

        self.undo_bar = QFrame()
        self.undo_bar.setObjectName("undoBar")
        ub = QHBoxLayout(self.undo_bar)
        ub.setContentsMargins(8, 4, 4, 4)
        self.undo_label = QLabel()
        self.undo_button = QPushButton("Undo")
        self.undo_button.setToolTip("Bring the deleted chat back (Ctrl+Z)")
        self.undo_button.clicked.connect(self.undo_delete)
        ub.addWidget(self.undo_label, 1)
        ub.addWidget(self.undo_button)
        self.undo_bar.hide()
        lay.addWidget(self.undo_bar)
        self._undo_timer = QTimer(self)
        self._undo_timer.setSingleShot(True)
        self._undo_timer.timeout.connect(self.undo_bar.hide)

        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(150)
        self._search_timer.timeout.connect(self.refresh)
        self.search.textChanged.connect(lambda _: self._search_timer.start())

    # ------------------------------------------------------------ content

    def refresh(self) -> None:
        if self.history is None:
            return
        query = self.search.text().strip()
        if query:
            rows, seen = [], set()
            for hit in self.history.search(query):
                if hit.conversation_id not in seen:
                    seen.add(hit.conversation_id)
                    rows.append(Row(hit.conversation_id, hit.title, hit.snippet, hit.message_id))
        else:
            rows = [Row(c.id, c.title, when(c.updated)) for c in self.history.list_conversations()]
        self.model.set_rows(rows)
        self.select(self.current_id)

    def stop(self) -> None:
        self._search_timer.stop()
        self._undo_timer.stop()
        self.history = None  # closed with the window; nothing may read it afterwards

    def select(self, conversation_id: str | None) -> None:
        self.current_id = conversation_id
        row = self.model.row_of(conversation_id) if conversation_id else None
        if row is None:
            self.list.clearSelection()
            return
        self.list.setCurrentIndex(self.model.index(row, 0))

    def keyPressEvent(self, e) -> None:
        if e.matches(QKeySequence.StandardKey.Delete) and self.list.currentIndex().isValid():
            self.delete(self.list.currentIndex().data(IdRole))
            return
        super().keyPressEvent(e)

    # ------------------------------------------------------------ actions

    def _menu(self, pos) -> None:
        index = self.list.indexAt(pos)
        if not index.isValid():
            return
        cid = index.data(IdRole)
        menu = QMenu(self)
        menu.addAction("Rename", lambda: self.list.edit(index))
        menu.addAction("Export…", lambda: self.exportRequested.emit(cid))
        menu.addAction("Delete", lambda: self.delete(cid))
        menu.exec(self.list.viewport().mapToGlobal(pos))

    def _activate(self, index) -> None:
        row = self.model.rows[index.row()]
        if row.message_id is not None:
            self.messageActivated.emit(row.id, row.message_id)
        else:
            self.conversationActivated.emit(row.id)

    def rename_current(self) -> None:
        if self.list.currentIndex().isValid():
            self.list.edit(self.list.currentIndex())

    def delete(self, conversation_id: str) -> None:
        row = self.model.row_of(conversation_id)
        title = self.model.rows[row].title if row is not None else "chat"
        self._deleted.append((conversation_id, title))
        self.undo_label.setText(f"Deleted “{title}”")  # before the signal: the window repeats it
        self.deleteRequested.emit(conversation_id)
        self.undo_bar.show()
        self._undo_timer.start(UNDO_SECONDS * 1000)

    def undo_delete(self) -> None:
        if not self._deleted:
            return
        cid, _ = self._deleted.pop()
        self.undoRequested.emit(cid)
        if self._deleted:
            self.undo_label.setText(f"Deleted “{self._deleted[-1][1]}”")
        else:
            self.undo_bar.hide()
