"""One conversation on screen: the controller (send, stop, regenerate, edit), the message list
(model, delegate, Markdown), the Retry button, the sidebar of chats and a chat's export.
May import: connection, composer, memory, settings, history and the root modules."""

from .chat_controller import ChatController
from .chat_export import ChatExport
from .chat_view import ChatView
from .message_model import MessageListModel
from .retry_button import RetryButton
from .sidebar import UNDO_SECONDS, Sidebar

__all__ = ["UNDO_SECONDS", "ChatController", "ChatExport", "ChatView", "MessageListModel", "RetryButton", "Sidebar"]
