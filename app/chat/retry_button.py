"""'Retry' under a failed turn: sends the conversation's last turn again (a partial reply a cut
stream left is replaced, as Regenerate does). Shown only for the open conversation's failure."""

from __future__ import annotations

from PySide6.QtWidgets import QPushButton

from .chat_controller import ChatController


class RetryButton(QPushButton):
    def __init__(self, controller: ChatController, parent=None):
        super().__init__("Retry", parent)
        self.setObjectName("retryButton")
        self.setToolTip("Send this turn again")
        self.controller = controller
        self.hide()
        controller.turnFailed.connect(self._on_failed)
        controller.currentChanged.connect(lambda _cid: self.hide())
        controller.generatingChanged.connect(lambda busy: self.hide() if busy else None)
        self.clicked.connect(self.retry)

    def _on_failed(self, conversation_id: str) -> None:
        self.setVisible(conversation_id == self.controller.current_id)

    def retry(self) -> None:
        self.hide()
        self.controller.regenerate()
