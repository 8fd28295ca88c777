"""Conversations on disk: the history (SQLite, WAL, with the content-addressed picture store),
its database file and schema (history_db), a chat's name (chat_titles) and a chat written out as
Markdown and JSON (export). No Qt.
May import: nothing else in app/ (the bottom room)."""

from .chat_titles import title_from, unique_title
from .export import ExportedChat, ExportError, export_chat
from .history import DEFAULT_TITLE, INTERRUPTED, History, StoredMessage, StoredPicture, Versions
from .history_db import HistoryUnavailable

__all__ = [
    "ExportError",
    "ExportedChat",
    "export_chat",
    "DEFAULT_TITLE",
    "INTERRUPTED",
    "History",
    "HistoryUnavailable",
    "StoredPicture",
    "StoredMessage",
    "title_from",
    "unique_title",
    "Versions",
]
