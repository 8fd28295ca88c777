"""Settings ▸ Engine: Built-in, or a remote OpenAI-compatible server (address, API key, model
chosen from the server's /v1/models). Several servers are kept; the chosen one is used.

Asking a server for its models waits on the network (up to 15 s for a silent one), so it runs on
an app.worker Worker: the box says "Checking…" meanwhile and stays usable, and a newer check, an
edited address or another server drops the answer of the one before."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QRadioButton,
    QWidget,
)

from engine.remote import RemoteConfig, RemoteConfigError
from engine.remote.engine import ServerError, list_models

from ..worker import Job, Worker
from .engine_choice import BUILTIN, REMOTE, EngineChoice, SavedServer


class EngineBox(QGroupBox):
    checked = Signal(list)  # a check's model names, after the box showed them ([]: it failed and says why)

    def __init__(self, choice: EngineChoice, parent=None):
        super().__init__("Engine", parent)
        self.setObjectName("engineGroup")
        # a superseded check still holds its thread until the server answers or times out, so
        # a few may run at once: the newest never waits behind a silent server
        self.checks = Worker("engine-box-check", threads=3, parent=self)
        self._check: Job | None = None  # the check whose answer the box waits for
        self.servers: list[SavedServer] = list(choice.servers)
        form = QFormLayout(self)
        self.builtin = QRadioButton("Built-in: the model on this computer")
        self.remote = QRadioButton("Remote server: vLLM, transformers serve, another Parley…")
        (self.remote if choice.kind == REMOTE else self.builtin).setChecked(True)
        form.addRow(self.builtin)
        form.addRow(self.remote)

        self.server_list = QComboBox()
        self.server_list.setObjectName("savedServers")
        add = QPushButton("Add")
        self.remove = QPushButton("Remove")
        row = QWidget()
        rl = QHBoxLayout(row)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addWidget(self.server_list, 1)
        rl.addWidget(add)
        rl.addWidget(self.remove)
        form.addRow("Server", row)
        self.url = QLineEdit()
        self.url.setPlaceholderText("http://gpu-box:8000/v1")
        self.api_key = QLineEdit()
        self.api_key.setEchoMode(QLineEdit.EchoMode.PasswordEchoOnEdit)
        self.api_key.setPlaceholderText("if the server wants one")
        self.model = QComboBox()
        self.model.setEditable(True)
        edit = self.model.lineEdit()
        assert edit is not None  # setEditable(True) just made it
        edit.setPlaceholderText("the server's first model")
        self.fetch = QPushButton("Fetch models")
        mrow = QWidget()
        ml = QHBoxLayout(mrow)
        ml.setContentsMargins(0, 0, 0, 0)
        ml.addWidget(self.model, 1)
        ml.addWidget(self.fetch)
        form.addRow("Address", self.url)
        form.addRow("API key", self.api_key)
        form.addRow("Model", mrow)
        self.checking = QLabel()
        self.checking.setObjectName("mutedLabel")
        self.checking.hide()
        form.addRow(self.checking)
        self.error = QLabel()
        self.error.setObjectName("problemLabel")
        self.error.setWordWrap(True)
        self.error.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error.hide()
        form.addRow(self.error)
        self._fields = (self.server_list, add, self.remove, self.url, self.api_key, self.model, self.fetch)

        self._refresh_list(choice.current if self.servers else -1)
        self.remote.toggled.connect(self._sync)
        add.clicked.connect(self.add_server)
        self.remove.clicked.connect(self.remove_server)
        self.server_list.currentIndexChanged.connect(self._show_server)
        self.url.textEdited.connect(self._store_fields)
        self.api_key.textEdited.connect(self._store_fields)
        self.url.textEdited.connect(self._drop_check)
        self.url.textChanged.connect(self._sync_fetch)  # an address typed into a new server can be checked
        self.api_key.textEdited.connect(self._drop_check)
        self.model.editTextChanged.connect(self._store_fields)
        self.fetch.clicked.connect(self.fetch_models)
        self._sync()

    # ------------------------------------------------------------ saved servers

    def _refresh_list(self, select: int) -> None:
        self.server_list.blockSignals(True)
        self.server_list.clear()
        for s in self.servers:
            self.server_list.addItem(s.label)
        self.server_list.setCurrentIndex(select)
        self.server_list.blockSignals(False)
        self._show_server(select)

    def _show_server(self, index: int) -> None:
        self._drop_check()  # its models are another server's
        s = self.servers[index] if 0 <= index < len(self.servers) else SavedServer("")
        self._loading = True
        self.url.setText(s.url)
        self.api_key.setText(s.api_key)
        self.model.clear()
        self.model.setEditText(s.model)
        self._loading = False
        self._sync()

    def _store_fields(self, *_args) -> None:
        if getattr(self, "_loading", False):
            return
        i = self.server_list.currentIndex()
        entry = SavedServer(self.url.text().strip(), self.api_key.text().strip(), self.model.currentText().strip())
        if i < 0:  # typing into an empty list makes the first server
            self.servers.append(entry)
            self._refresh_list(len(self.servers) - 1)
            return
        self.servers[i] = entry
        self.server_list.setItemText(i, entry.label)
        self.error.hide()

    def add_server(self) -> None:
        self.servers.append(SavedServer(""))
        self._refresh_list(len(self.servers) - 1)
        self.remote.setChecked(True)
        self.url.setFocus()

    def remove_server(self) -> None:
        i = self.server_list.currentIndex()
        if 0 <= i < len(self.servers):
            del self.servers[i]
            self._refresh_list(min(i, len(self.servers) - 1))

    def _sync(self, *_args) -> None:
        on = self.remote.isChecked()
        for w in self._fields:
            w.setEnabled(on)
        has = 0 <= self.server_list.currentIndex() < len(self.servers)
        self.remove.setEnabled(on and has)
        self._sync_fetch()
        self.error.hide()

    def _sync_fetch(self, *_args) -> None:
        self.fetch.setEnabled(self.remote.isChecked() and bool(self.url.text().strip()))

    # ------------------------------------------------------------ models from the server

    def fetch_models(self) -> None:
        """Ask the server for its models (GET /v1/models) off the UI thread; `checked` says when
        the box offers them, or shows why not. A check still running is superseded."""
        self._drop_check()
        self.error.hide()
        try:
            cfg = RemoteConfig.make(self.url.text(), "", self.api_key.text(), timeout_s=15.0, connect_timeout_s=5.0)
        except RemoteConfigError as exc:
            self.show_error(str(exc))
            self.checked.emit([])
            return
        self.checking.setText(f"Checking {cfg.server}…")
        self.checking.show()
        self._check = self.checks.submit(
            lambda _job: list_models(cfg),  # a ServerError says why, in words for the box
            on_done=lambda names: self._offer(cfg, names),
            on_error=self._check_failed,
        )

    def _drop_check(self, *_args) -> None:
        if self._check is not None:
            self._check.cancel()
            self._check = None
        self.checking.hide()

    def _check_failed(self, exc: BaseException) -> None:
        self._check = None
        self.checking.hide()
        # a ServerError is already a sentence for the box; anything else is named
        self.show_error(str(exc) if isinstance(exc, ServerError) else f"{type(exc).__name__}: {exc}")
        self.checked.emit([])

    def _offer(self, cfg: RemoteConfig, names: list[str]) -> None:
        self._check = None
        self.checking.hide()
        keep = self.model.currentText().strip()
        self.model.blockSignals(True)
        self.model.clear()
        self.model.addItems(names)
        self.model.setEditText(keep if keep in names else (names[0] if names else ""))
        self.model.blockSignals(False)
        self._store_fields()
        if not names:
            self.show_error(f"The server at {cfg.server} offers no model.")
        self.checked.emit(names)

    def show_error(self, message: str) -> None:
        self.error.setText(message)
        self.error.show()

    # ------------------------------------------------------------ result

    def choice(self) -> EngineChoice:
        servers = tuple(s for s in self.servers if s.url)
        current = self.server_list.currentIndex()
        picked = self.servers[current] if 0 <= current < len(self.servers) else None
        index = servers.index(picked) if picked in servers else 0
        kind = REMOTE if self.remote.isChecked() else BUILTIN
        return EngineChoice(kind, servers, index)

    def problem(self) -> str | None:
        """Why OK cannot take this choice (shown in the box), or None."""
        error = self.choice().problem()
        if error:
            self.show_error(error)
        return error
