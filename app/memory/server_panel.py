"""The memory dock for a remote engine: the server owns memory there, so it shows the server,
its model, the last turn's time to first token, tokens per second and cached-prompt share,
and the last error."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDockWidget, QFormLayout, QLabel, QWidget

from engine.protocol.events import ServerReport


def _fmt(value, fmt: str, missing: str = "—") -> str:
    return missing if value is None else fmt.format(value)


class ServerPanel(QDockWidget):
    def __init__(self, parent=None):
        super().__init__("Server", parent)
        self.setObjectName("serverDock")
        body = QWidget()
        form = QFormLayout(body)
        self.rows: dict[str, QLabel] = {}
        for key, title in (
            ("server", "Server"),
            ("model", "Model"),
            ("state", "State"),
            ("ttft", "First token"),
            ("speed", "Speed"),
            ("cached", "Cached prompt"),
            ("turns", "Turns"),
            ("error", "Last error"),
        ):
            label = QLabel("—")
            label.setObjectName(f"server_{key}")
            label.setWordWrap(True)
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self.rows[key] = label
            form.addRow(title, label)
        note = QLabel("The server keeps its own memory and caches (prefix caching, KV offload).")
        note.setWordWrap(True)
        form.addRow(note)
        self.setWidget(body)

    def text(self, key: str) -> str:
        return self.rows[key].text()

    def on_server_report(self, r: ServerReport) -> None:
        self.rows["server"].setText(r.server)
        self.rows["model"].setText(r.model or "—")
        # the latest request decides: asking for the models, or a turn
        state = {"ready": "connected", "connecting": "connecting…", "failed": "last request failed"}
        self.rows["state"].setText(state.get(r.state, r.state))
        self.rows["ttft"].setText(_fmt(r.ttft_s, "{:.2f} s"))
        self.rows["speed"].setText(_fmt(r.tokens_per_s, "{:.1f} tok/s"))
        cached = "not reported" if r.cached_share is None and r.turns else _fmt(r.cached_share, "{:.0%}")
        if r.cached_share is not None and r.prompt_tokens:
            cached += f" of {r.prompt_tokens} tokens"
        self.rows["cached"].setText(cached)
        self.rows["turns"].setText(str(r.turns))
        self.rows["error"].setText(r.last_error or "none")
        self._mark_problem(self.rows["error"], bool(r.last_error))

    @staticmethod
    def _mark_problem(label: QLabel, problem: bool) -> None:
        """The theme's problem colour only on an actual problem ("none" is not one)."""
        name = "problemLabel" if problem else "server_error"
        if label.objectName() != name:
            label.setObjectName(name)
            label.style().unpolish(label)
            label.style().polish(label)
