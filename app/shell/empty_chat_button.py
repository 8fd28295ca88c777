"""'Get a model…' under the empty chat's hint while no model is loaded, 'Get a real model…' while
the built-in demo is: the Models page is one click away from where a new user looks first."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QPushButton

from engine.platform.paths import DEMO_MODEL

GET_A_MODEL = "Get a model…"
GET_A_REAL_MODEL = "Get a real model…"
# The demo answers only about coloured shapes; a newcomer who asks it anything else should know why
# before the first reply, and where a real model comes from.
HINT_DEMO = "The built-in model is a small demo that only knows coloured shapes."


def is_demo(model_path: str | None) -> bool:
    """Whether a loaded model's path is the built-in demo's folder (a server's address never is)."""
    if not model_path or "://" in model_path:
        return False
    try:
        return Path(model_path).resolve() == DEMO_MODEL.resolve()
    except OSError:
        return False


class EmptyChatModelsButton(QPushButton):
    """Positions and shows itself: visible while wanted and the chat has no rows."""

    def __init__(self, chat_view, on_click):
        super().__init__(GET_A_MODEL, chat_view.viewport())
        self.setObjectName("emptyChatModels")
        self.chat = chat_view
        self.wanted = False
        self.clicked.connect(on_click)
        chat_view.viewport().installEventFilter(self)
        model = chat_view.model()
        for sig in (model.rowsInserted, model.rowsRemoved, model.modelReset):
            sig.connect(self._refresh)
        self.hide()

    def want(self, wanted: bool, label: str = GET_A_MODEL) -> None:
        self.wanted = wanted
        self.setText(label)
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
