"""Conversations on disk: the history (SQLite, WAL, with the content-addressed picture store),
its database file and schema (history_db), and a chat's name (chat_titles). No Qt.
May import: nothing else in app/ (the bottom room)."""

from .chat_titles import title_from, unique_title
from .history import DEFAULT_TITLE, INTERRUPTED, History, StoredMessage, StoredPicture

__all__ = ["DEFAULT_TITLE", "INTERRUPTED", "History", "StoredPicture", "StoredMessage", "title_from", "unique_title"]
