"""Export a chat from the window: ask for a folder, write the chat there off the UI thread
(app/history/export.py: pages are drawn and frames decoded for it), and say in the status bar
where it went, or the one line that says why not.

Threading: `start` runs on the UI thread; the export itself on this object's Worker thread, which
only reads the history (its own lock makes that safe beside the UI thread's writes).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, QStandardPaths
from PySide6.QtWidgets import QFileDialog, QWidget

from ..history import ExportedChat, ExportError, History, export_chat
from ..worker import Worker


class ChatExport(QObject):
    def __init__(self, history: History, say: Callable[[str], None], parent: QWidget):
        super().__init__(parent)
        self.history, self.say, self.parent_widget = history, say, parent
        self.work = Worker("chat-export", parent=self)
        self.folder = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation) or str(
            Path.home()
        )

    def start(self, conversation_id: str | None) -> None:
        """Ask for a folder, then export the chat into it."""
        if not conversation_id:
            self.say("Open a chat to export it.")
            return
        folder = QFileDialog.getExistingDirectory(self.parent_widget, "Export the chat into…", self.folder)
        if folder:
            self.export_to(conversation_id, folder)

    def export_to(self, conversation_id: str, folder: str) -> None:
        """Export into `folder` (what `start` does once a folder is chosen)."""
        self.folder = folder
        self.say("Exporting…")
        self.work.submit(lambda _job: export_chat(self.history, conversation_id, folder), self._done, self._failed)

    def _done(self, done: ExportedChat) -> None:
        pictures = f" with {done.pictures} pictures" if done.pictures else ""
        gone = f"; {len(done.missing)} pictures were missing and are named instead" if done.missing else ""
        self.say(f"Exported to {done.markdown}{pictures}{gone}")

    def _failed(self, error: BaseException) -> None:
        self.say(str(error) if isinstance(error, ExportError) else f"Not exported: {error}")
