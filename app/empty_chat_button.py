"""'Get a model…' under the empty chat's hint while no model is loaded: the Models page is one
click away from where a new user looks first."""
from __future__ import annotations

from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QPushButton


class EmptyChatModelsButton(QPushButton):
    """Positions and shows itself: visible while wanted and the chat has no rows."""

    def __init__(self, chat_view, on_click):
        super().__init__("Get a model…", chat_view.viewport())
        self.setObjectName("emptyChatModels")
        self.chat = chat_view
        self.wanted = False
        self.clicked.connect(on_click)
        chat_view.viewport().installEventFilter(self)
        model = chat_view.model()
        for sig in (model.rowsInserted, model.rowsRemoved, model.modelReset):
            sig.connect(self._refresh)
        self.hide()

    def want(self, wanted: bool) -> None:
        self.wanted = wanted
        self._refresh()

    def _refresh(self, *_):
        show = self.wanted and self.chat.model().rowCount() == 0
        if show:
            self.adjustSize()
            r = self.chat.viewport().rect()
            self.move((r.width() - self.width()) // 2, r.height() // 2 + 3 * self.fontMetrics().height())
        self.setVisible(show)

    def eventFilter(self, obj, event) -> bool:
        if event.type() == QEvent.Type.Resize:
            self._refresh()
        return False
