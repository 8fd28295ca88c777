"""Choosing a model: the demo, recent folders, VLMs in the Hugging Face cache, or any folder.

An entry that cannot be loaded says why (the engine's own check) and cannot be chosen.
Loading itself happens on the engine thread; this dialog only returns a path.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QPalette
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
)

from .model_catalog import ModelEntry, demo_entry, hf_hub_dir, recent_entries, scan_hf_cache

PathRole = Qt.ItemDataRole.UserRole + 1
ProblemRole = Qt.ItemDataRole.UserRole + 2
SOURCE_TITLES = {"demo": "Demo", "recent": "Recent", "cache": "Hugging Face cache"}


def problem_tag(e: ModelEntry) -> str:
    if e.source == "demo" and "not installed" in (e.problem or ""):
        return "not installed yet"
    if (e.problem or "").startswith("Unsupported architecture"):
        return "unsupported"
    return "cannot load"


class ModelPicker(QDialog):
    def __init__(
        self,
        recent: list[str],
        check: Callable[[Path], str | None],
        hub: Path | None = None,
        current: str | None = None,
        parent=None,
    ):
        super().__init__(parent)
        self.setWindowTitle("Choose a model")
        self.setObjectName("modelPicker")
        self.resize(560, 440)
        self.check = check
        self.chosen: str | None = None
        self.wants_models = False  # "Get models…": the window opens the Models page next
        lay = QVBoxLayout(self)
        self.list = QListWidget()
        self.list.setObjectName("modelList")
        lay.addWidget(self.list, 1)
        self.path_label = QLabel()
        self.path_label.setObjectName("mutedLabel")
        self.path_label.setWordWrap(True)
        self.path_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(self.path_label)
        self.why = QLabel()
        self.why.setObjectName("problemLabel")
        self.why.setWordWrap(True)
        lay.addWidget(self.why)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.folder = QPushButton("Choose folder…")
        self.buttons.addButton(self.folder, QDialogButtonBox.ButtonRole.ActionRole)
        self.get_models = QPushButton("Get models…")
        self.buttons.addButton(self.get_models, QDialogButtonBox.ButtonRole.ActionRole)
        self.get_models.clicked.connect(self._open_models)
        self.load = self.buttons.addButton("Load", QDialogButtonBox.ButtonRole.AcceptRole)
        self.folder.clicked.connect(self.choose_folder)
        self.buttons.accepted.connect(self._accept_selected)
        self.buttons.rejected.connect(self.reject)
        lay.addWidget(self.buttons)
        self.list.currentItemChanged.connect(self._on_current)
        self.list.itemDoubleClicked.connect(lambda _: self._accept_selected())

        hub = hub or hf_hub_dir()
        groups = [[demo_entry(check)], recent_entries(recent, check), scan_hf_cache(hub, check)]
        if not groups[2]:
            self._header(f"Hugging Face cache — no vision-language models in {hub}")
        for entries in groups:
            if entries:
                self._header(SOURCE_TITLES[entries[0].source])
            for e in entries:
                self._add(e, current)
        if self.list.currentItem() is None:
            for i in range(self.list.count()):
                it = self.list.item(i)
                if it.data(PathRole) and not it.data(ProblemRole):
                    self.list.setCurrentItem(it)
                    break
        self._on_current(self.list.currentItem(), None)

    def _open_models(self) -> None:
        self.wants_models = True
        self.reject()

    def _header(self, text: str) -> None:
        it = QListWidgetItem(text)
        it.setFlags(Qt.ItemFlag.NoItemFlags)
        f = it.font()
        f.setBold(True)
        it.setFont(f)
        self.list.addItem(it)

    def _add(self, e: ModelEntry, current: str | None) -> None:
        label = e.name + (f"  ·  {e.family}" if e.family else "")
        if e.source == "demo":
            label += "  ·  demo"
        if e.problem:
            label += "  ·  " + problem_tag(e)
        it = QListWidgetItem(label)
        it.setData(PathRole, e.path)
        it.setData(ProblemRole, e.problem)
        it.setToolTip(e.path if not e.problem else f"{e.path}\n{e.problem}")
        if e.problem:
            it.setForeground(QBrush(self.palette().color(QPalette.ColorRole.PlaceholderText)))
        self.list.addItem(it)
        if current and Path(current).resolve() == Path(e.path).resolve():
            self.list.setCurrentItem(it)

    def _on_current(self, item, _prev) -> None:
        problem = item.data(ProblemRole) if item else None
        path = item.data(PathRole) if item else None
        self.path_label.setText(path or "")
        self.why.setText(problem or "")
        self.why.setVisible(bool(problem))
        self.load.setEnabled(bool(path) and not problem)

    def _accept_selected(self) -> None:
        item = self.list.currentItem()
        if item and item.data(PathRole) and not item.data(ProblemRole):
            self.chosen = item.data(PathRole)
            self.accept()

    def choose_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Model folder (the one with config.json)", str(Path.home()))
        if path:
            self.try_folder(path)

    def try_folder(self, path: str) -> bool:
        """Accept a folder (or a repo id in the HF cache) if the engine's check passes; else show
        why and stay open."""
        from engine.library.installed import partial_download, resolve_model

        unfinished = partial_download(path)  # a repo id whose pull did not finish: say so, not "no folder"
        path = str(resolve_model(path) or path)
        problem = unfinished or self.check(Path(path))
        if problem:
            self.path_label.setText(path)
            self.why.setText(problem)
            self.why.show()
            self.load.setEnabled(False)
            return False
        self.chosen = path
        self.accept()
        return True
