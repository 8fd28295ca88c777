"""One conversation on screen: the controller (send, stop, regenerate, edit), the message list
(model, delegate, Markdown), the Retry button and the sidebar of chats.
May import: connection, composer, memory, settings, history and the root modules."""

from .chat_controller import ChatController
from .chat_view import ChatView
from .message_model import MessageListModel
from .retry_button import RetryButton
from .sidebar import UNDO_SECONDS, Sidebar

__all__ = ["UNDO_SECONDS", "ChatController", "ChatView", "MessageListModel", "RetryButton", "Sidebar"]
