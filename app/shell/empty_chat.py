"""What the empty chat offers under its hint: 'Get a model…' while no model is loaded, 'Get a real
model…' and three example questions while the built-in demo is. The Models page, and a first
question the demo answers well, are one click away from where a new user looks first."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtWidgets import QBoxLayout, QPushButton, QVBoxLayout, QWidget

from ..icons import resources_dir

GET_A_MODEL = "Get a model…"
GET_A_REAL_MODEL = "Get a real model…"
# The demo answers only about coloured shapes; a newcomer who asks it anything else should know why
# before the first reply, and where a real model comes from.
HINT_DEMO = "The built-in model is a small demo that only knows coloured shapes."

# A drawing the demo was never trained on (a red circle at the bottom left, a blue square at the top
# right); tests/packaging/test_demo_model.py asks it these three questions and checks the answers
# word for word. A new user without a picture of shapes to hand gets one with the question. Where a
# shape is and which is on a side are what a person asks of a drawing first, and what issue 43's
# weights learned (drawn set: where 93%, side 89%; the weights before: 66% and 0%).
EXAMPLE_PICTURE = "shapes-example.png"
EXAMPLE_QUESTIONS = ("Describe the picture.", "Where is the red circle?", "What shape is on the right?")


def example_picture() -> Path:
    return resources_dir() / "examples" / EXAMPLE_PICTURE


class EmptyChatActions(QWidget):
    """Positions and shows itself on the chat's viewport: visible while something is wanted and the
    chat has no rows. The example questions sit in a row, or in a column where a row would not fit."""

    questionChosen = Signal(str)

    def __init__(self, chat_view, on_models):
        super().__init__(chat_view.viewport())
        self.chat = chat_view
        self.models = QPushButton(GET_A_MODEL)
        self.models.setObjectName("emptyChatModels")
        self.models.clicked.connect(on_models)
        self.example_row = QBoxLayout(QBoxLayout.Direction.LeftToRight)
        self.example_row.setSpacing(6)
        self._examples: list[QPushButton] = []
        for question in EXAMPLE_QUESTIONS:
            b = QPushButton(question)
            b.setObjectName("exampleQuestion")
            b.setToolTip("Put this question and an example drawing into the message box")
            b.clicked.connect(lambda _=False, q=question: self.questionChosen.emit(q))
            self.example_row.addWidget(b)
            self._examples.append(b)
        self.column = QVBoxLayout(self)
        self.column.setContentsMargins(0, 0, 0, 0)
        self.column.setSpacing(10)
        self.column.addWidget(self.models, 0, Qt.AlignmentFlag.AlignHCenter)
        self.column.addLayout(self.example_row)
        self.wanted_models = False
        self.wanted_examples = False
        chat_view.viewport().installEventFilter(self)
        model = chat_view.model()
        for sig in (model.rowsInserted, model.rowsRemoved, model.modelReset):
            sig.connect(self._refresh)
        self.hide()

    def want(self, models: str | None, examples: bool) -> None:
        """`models`: the Models button's label, or None for no button; `examples`: the questions."""
        self.wanted_models = models is not None
        self.models.setText(models or GET_A_MODEL)
        self.wanted_examples = examples
        self._refresh()

    def example_buttons(self) -> list[QPushButton]:
        return list(self._examples)

    def _refresh(self, *_) -> None:
        show = (self.wanted_models or self.wanted_examples) and self.chat.model().rowCount() == 0
        if show:
            self.models.setVisible(self.wanted_models)
            buttons = self.example_buttons()
            for b in buttons:
                b.setVisible(self.wanted_examples)
            r = self.chat.viewport().rect()
            in_a_row = sum(b.sizeHint().width() for b in buttons) + (len(buttons) - 1) * self.example_row.spacing()
            self.example_row.setDirection(
                QBoxLayout.Direction.LeftToRight if in_a_row <= r.width() - 16 else QBoxLayout.Direction.TopToBottom
            )
            self.column.activate()
            self.adjustSize()
            # under the hint, which is centred; kept inside the viewport when it is short
            y = min(r.height() // 2 + 3 * self.fontMetrics().height(), r.height() - self.height() - 8)
            self.move((r.width() - self.width()) // 2, max(0, y))
        self.setVisible(show)

    def eventFilter(self, obj, event) -> bool:
        if event.type() == QEvent.Type.Resize:
            self._refresh()
        return False
