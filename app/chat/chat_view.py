"""The message list: a QListView over MessageListModel, painted by MessageDelegate.

It follows the newest message while the user is at the bottom (streaming keeps the reply in
view) and leaves the scroll position alone once they scroll up to read.
"""

from __future__ import annotations

from PySide6.QtCore import QElapsedTimer, QMimeData, QModelIndex, QPoint, Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication, QKeySequence, QPainter, QPalette
from PySide6.QtWidgets import QAbstractItemView, QListView, QMenu, QStyle

from ..composer import mime_has_pictures
from .message_delegate import MessageDelegate
from .message_model import IsLastRole, MessageIdRole, MessageListModel, RoleRole, StreamingRole

RELAYOUT_MIN_MS = 80  # a streaming reply that keeps growing re-flows the list at most this often


class ChatView(QListView):
    actionTriggered = Signal(str, int)  # (a message_delegate.ACTION_LABELS key, message id)
    mimeDropped = Signal(QMimeData)  # pictures dropped on the conversation

    def __init__(self, model: MessageListModel, parent=None):
        super().__init__(parent)
        self.setModel(model)
        self.msg_model = model
        self.delegate = MessageDelegate(self)
        self.setItemDelegate(self.delegate)
        self.setObjectName("chatView")
        self.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.verticalScrollBar().setSingleStep(24)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setResizeMode(QListView.ResizeMode.Adjust)
        self.setUniformItemSizes(False)
        self.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.setMouseTracking(True)
        self.setAcceptDrops(True)
        self.setDragDropMode(QAbstractItemView.DragDropMode.DropOnly)
        self.setFrameShape(QListView.Shape.NoFrame)
        self.placeholder = ""
        self.layout_width = 200  # the width rows are laid out for (set by doItemsLayout)
        self._follow = True
        self._since_layout = QElapsedTimer()
        self._layout_timer = QTimer(self)
        self._layout_timer.setSingleShot(True)
        self._layout_timer.timeout.connect(self._relayout)
        self._stream_clock = QElapsedTimer()
        self._stream_row = 0
        self._stream_timer = QTimer(self)
        self._stream_timer.setSingleShot(True)
        self._stream_timer.timeout.connect(self._on_stream_timer)
        self.delegate.actionTriggered.connect(self.actionTriggered)
        self.verticalScrollBar().valueChanged.connect(self._on_scrolled)
        self.verticalScrollBar().rangeChanged.connect(self._on_range)
        model.dataChanged.connect(self._on_data_changed)
        model.textGrew.connect(self._on_text_grew)
        model.modelReset.connect(self._on_reset)
        model.rowsInserted.connect(lambda *_: self._relayout())
        model.rowsRemoved.connect(lambda *_: self._relayout())

    # ------------------------------------------------------------ following the newest message

    def _on_scrolled(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._follow = value >= bar.maximum() - 4

    def _on_range(self, _lo: int, hi: int) -> None:
        if self._follow:
            self.verticalScrollBar().setValue(hi)

    def _on_reset(self) -> None:
        self.delegate.hover = None
        self.delegate.selection = None  # another chat: its text is not what was selected
        self._follow = True
        self._relayout()
        self.scrollToBottom()

    def _on_data_changed(self, top: QModelIndex, _bottom: QModelIndex, _roles=()) -> None:
        self._relayout()

    def _on_text_grew(self, row: int) -> None:
        # Re-rendering a long reply costs milliseconds (Markdown + layout), so it runs at most
        # every 3x its own cost: a 12 KB reply re-renders ~25 times a second, a 40 KB one ~8.
        gap = 3 * self.delegate.last_stream_build_ms
        if self._stream_clock.isValid() and self._stream_clock.elapsed() < gap:
            self._stream_row = row
            if not self._stream_timer.isActive():
                self._stream_timer.start(max(1, int(gap - self._stream_clock.elapsed())))
            return
        self._stream_clock.start()
        self._stream_timer.stop()
        self._render_grown(row)

    def _on_stream_timer(self) -> None:
        self._stream_clock.start()
        self._render_grown(self._stream_row)

    def _render_grown(self, row: int) -> None:
        if row >= self.msg_model.rowCount():
            return
        # A relayout asks every row for its size, so it is skipped while the streaming row keeps
        # its height (the delegate reserves a few lines ahead) and rate-limited when it grows.
        index = self.msg_model.index(row, 0)
        old = self.delegate.cached_height(index)
        new = self.delegate.sizeHint(None, index).height()
        if old == new:
            self.update(index)
        else:
            self._relayout(throttle=True)

    def _relayout(self, throttle: bool = False) -> None:
        if throttle:
            wait = RELAYOUT_MIN_MS - self._since_layout.elapsed()
            if self._since_layout.isValid() and wait > 0:
                if not self._layout_timer.isActive():
                    self._layout_timer.start(int(wait))
                return
        self._layout_timer.stop()
        self._since_layout.start()
        self.scheduleDelayedItemsLayout()

    def doItemsLayout(self) -> None:
        # Rows are as wide as the viewport *with* a scroll bar, shown or not: otherwise the first
        # layout of a long conversation (no bar yet) is thrown away when the bar appears.
        width = self.viewport().width()
        if not self.verticalScrollBar().isVisible():
            width -= self.style().pixelMetric(QStyle.PixelMetric.PM_ScrollBarExtent, None, self)
        self.layout_width = max(200, width)
        super().doItemsLayout()

    def following(self) -> bool:
        return self._follow

    # ------------------------------------------------------------ look

    def changeEvent(self, event) -> None:
        if event.type() in (event.Type.PaletteChange, event.Type.FontChange, event.Type.StyleChange):
            self.delegate.clear_caches()
            self._relayout()
        super().changeEvent(event)

    def paintEvent(self, event) -> None:
        super().paintEvent(event)
        if self.model().rowCount() == 0 and self.placeholder:
            p = QPainter(self.viewport())
            p.setPen(self.palette().color(QPalette.ColorRole.PlaceholderText))
            r = self.viewport().rect().adjusted(40, 40, -40, -40)
            p.drawText(r, Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap, self.placeholder)
            p.end()

    def set_placeholder(self, text: str) -> None:
        if text != self.placeholder:
            self.placeholder = text
            self.viewport().update()

    # ------------------------------------------------------------ menu and keys

    def contextMenuEvent(self, event) -> None:
        index = self.indexAt(event.pos())
        if not index.isValid():
            return
        mid = int(index.data(MessageIdRole))
        menu = QMenu(self)
        selected = (
            self.delegate.selected_text() if self.delegate.selection and self.delegate.selection[0] == mid else ""
        )
        if selected:
            menu.addAction("Copy selection", lambda: QGuiApplication.clipboard().setText(selected))
            menu.addAction("Copy message", lambda: self.actionTriggered.emit("copy", mid))
        else:
            menu.addAction("Copy", lambda: self.actionTriggered.emit("copy", mid))
        if index.data(RoleRole) == "user":
            menu.addAction("Edit and resend", lambda: self.actionTriggered.emit("edit", mid))
        elif index.data(IsLastRole) and not index.data(StreamingRole):
            menu.addAction("Regenerate", lambda: self.actionTriggered.emit("regenerate", mid))
            if self.delegate.offer_varied:
                menu.addAction("Regenerate (more varied)", lambda: self.actionTriggered.emit("varied", mid))
        menu.exec(event.globalPos())

    def keyPressEvent(self, event) -> None:
        if event.matches(QKeySequence.StandardKey.Copy) and self.delegate.selected_text():
            QGuiApplication.clipboard().setText(self.delegate.selected_text())
            return
        super().keyPressEvent(event)

    def offer_varied_regenerate(self, offer: bool) -> None:
        """Show "More varied" beside Regenerate (while replies are greedy, a plain one repeats)."""
        if offer != self.delegate.offer_varied:
            self.delegate.offer_varied = offer
            self.delegate.clear_caches()  # the footer's actions are part of each row's cached layout
            self._relayout()

    def action_point(self, message_id: int, name: str) -> QPoint | None:
        """Viewport point of a message's action link (for tests and accessibility tools)."""
        row = self.msg_model.row_of(message_id)
        if row is None:
            return None
        index = self.msg_model.index(row, 0)
        self.scrollTo(index)
        rect = self.delegate.action_rect(index, name)
        if rect is None:
            return None
        return self.visualRect(index).topLeft() + rect.center()

    # ------------------------------------------------------------ drops go to the composer

    def dragEnterEvent(self, event) -> None:
        if mime_has_pictures(event.mimeData()):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dragMoveEvent(self, event) -> None:
        if mime_has_pictures(event.mimeData()):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dropEvent(self, event) -> None:
        if mime_has_pictures(event.mimeData()):
            self.mimeDropped.emit(event.mimeData())
            event.acceptProposedAction()
        else:
            event.ignore()
