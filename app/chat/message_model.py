"""The messages of the open conversation as a list model (one row per message).

Rows change only at the end (append, stream into the last reply, truncate), so a streaming
token touches one row: dataChanged for that row, nothing else is rebuilt.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from PySide6.QtCore import QAbstractListModel, QModelIndex, QPersistentModelIndex, Qt, Signal

MessageIdRole = Qt.ItemDataRole.UserRole + 1
RoleRole = Qt.ItemDataRole.UserRole + 2  # "user" | "assistant"
PicturesRole = Qt.ItemDataRole.UserRole + 3  # list of absolute picture paths
StatusRole = Qt.ItemDataRole.UserRole + 4  # "complete" | "interrupted"
StreamingRole = Qt.ItemDataRole.UserRole + 5  # bool
EditedRole = Qt.ItemDataRole.UserRole + 6  # bool
RevisionRole = Qt.ItemDataRole.UserRole + 7  # int, bumps on every change (layout caches key on it)
IsLastRole = Qt.ItemDataRole.UserRole + 8  # bool


@dataclass
class MessageItem:
    id: int
    role: str
    text: str
    pictures: list[str] = field(default_factory=list)
    status: str = "complete"
    streaming: bool = False
    edited: bool = False
    revision: int = 0  # bumps on every change (layout caches key on it)
    versions: tuple[int, int] | None = None  # (shown, count), 1-based: "‹ 2/3 ›"; None: one version
    digests: list[str] = field(default_factory=list)  # each picture's content digest, in `pictures` order
    note: str = ""  # a reply's last-turn line (app/memory/turn_line.py), shown under it
    captions: list[str] = field(default_factory=list)  # under each picture ("report.pdf, page 3"; "": none)


class MessageListModel(QAbstractListModel):
    # Streaming text growth is announced with this instead of dataChanged: QListView (Qt 6.12)
    # re-flows every row on any dataChanged, which is ~10 ms per token batch at 500+ messages.
    # ChatView repaints the row and re-flows only when its height changes.
    textGrew = Signal(int)  # row

    def __init__(self, parent=None):
        super().__init__(parent)
        self._items: list[MessageItem] = []
        self._rows: dict[int, int] = {}
        self.conversation_id: str | None = None

    # ------------------------------------------------------------ Qt model

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self._items)

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self._items):
            return None
        it = self._items[index.row()]
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.EditRole):
            return it.text
        if role == Qt.ItemDataRole.ToolTipRole:
            return None
        return {
            MessageIdRole: it.id,
            RoleRole: it.role,
            PicturesRole: it.pictures,
            StatusRole: it.status,
            StreamingRole: it.streaming,
            EditedRole: it.edited,
            RevisionRole: it.revision,
            IsLastRole: index.row() == len(self._items) - 1,
        }.get(role)

    def roleNames(self):
        return {
            MessageIdRole: b"messageId",
            RoleRole: b"role",
            PicturesRole: b"pictures",
            StatusRole: b"status",
            StreamingRole: b"streaming",
            Qt.ItemDataRole.DisplayRole: b"text",
        }

    # ------------------------------------------------------------ changes

    def set_messages(self, conversation_id: str | None, items: list[MessageItem]) -> None:
        self.beginResetModel()
        self.conversation_id = conversation_id
        self._items = list(items)
        self._reindex()
        self.endResetModel()

    def append(self, item: MessageItem) -> None:
        n = len(self._items)
        self.beginInsertRows(QModelIndex(), n, n)
        self._items.append(item)
        self._rows[item.id] = n
        self.endInsertRows()
        if n:  # the old last row loses its "last" actions
            self._changed(n - 1)

    def append_text(self, message_id: int, text: str) -> None:
        row = self._rows.get(message_id)
        if row is None or not text:
            return
        it = self._items[row]
        it.text += text
        it.revision += 1
        self.textGrew.emit(row)

    def update(self, message_id: int, **changes) -> None:
        row = self._rows.get(message_id)
        if row is None:
            return
        it = replace(self._items[row], **changes)
        it.revision = self._items[row].revision + 1
        self._items[row] = it
        self._changed(row)

    def remove_from(self, message_id: int) -> None:
        """Remove this message and every later one."""
        row = self._rows.get(message_id)
        if row is None:
            return
        self.beginRemoveRows(QModelIndex(), row, len(self._items) - 1)
        del self._items[row:]
        self._reindex()
        self.endRemoveRows()
        if self._items:
            self._changed(len(self._items) - 1)

    # ------------------------------------------------------------ lookups

    def item(self, row: int) -> MessageItem:
        return self._items[row]

    def row_of(self, message_id: int) -> int | None:
        return self._rows.get(message_id)

    def items(self) -> list[MessageItem]:
        return list(self._items)

    def _reindex(self) -> None:
        self._rows = {it.id: i for i, it in enumerate(self._items)}

    def _changed(self, row: int) -> None:
        idx = self.index(row, 0)
        self.dataChanged.emit(idx, idx)
