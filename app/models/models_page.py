"""The Models page: the catalog and any repo id, whether each fits, download with progress,
pause/cancel, delete, and one click to load.

All Hub, disk and device work runs on a background thread through engine.library (plain
functions returning numbers); results come back as queued Qt signals. No torch here.
"""

from __future__ import annotations

import functools
import logging
import threading
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from engine.library import token_store
from engine.library.catalog import CatalogEntry, load_catalog
from engine.library.hub import LibraryError, NetworkUnreachable, is_repo_id, offline_forced

from ..sizes import human_bytes
from .download_text import progress_text

COLUMNS = ["Model", "Family", "Parameters", "Download", "Fit", "Installed", "Speed here"]
COL_PARAMS, COL_FIT, COL_INSTALLED, COL_SPEED = 2, 4, 5, 6
SPEED_TIP = (
    "Expected decode tokens/s per weight format on this computer, from Parley's own measurement "
    "of its kernels (taken when a model of this shape was first loaded; '~': scaled from another "
    "shape measured here). Measured the first time a model of 50M or more parameters loads (a few "
    'seconds); until then "not measured yet". Smaller models are fast in any format.'
)
UNKNOWN_SPEED = "—"  # no config.json yet: the model's layer sizes are not known
PRECISION_TIP = "The precision the Fit column sizes models at: at first, the one Parley runs the loaded model in"
log = logging.getLogger(__name__)


class _Signals(QObject):
    """Worker threads -> the page. Only plain values cross threads (no Python objects in queued
    signals); a worker whose page is gone gets RuntimeError from emit and stops quietly."""

    fit = Signal(str, str, str)  # repo id, fit cell text, tooltip
    speed = Signal(str, str)  # repo id, expected tokens/s here
    params = Signal(str, str)  # repo id, its parameter count counted from config.json ("870K")
    installed = Signal()  # the scan's result waits in ModelsPage._scanned
    progress = Signal(float, float, float, float, str)  # done, total, bytes/s, seconds left (-1: unknown), file
    done = Signal(str, str, str)  # repo id, snapshot folder ("" on failure), message
    notice = Signal(str)


class ModelsPage(QDialog):
    loadRequested = Signal(str)  # a snapshot folder to load

    def __init__(
        self,
        catalog: list[CatalogEntry] | None = None,
        recent: list[str] | None = None,
        parent=None,
        data_dir: Path | None = None,
        precision: str | None = None,
    ):
        """`precision`: what fits are sized at first (default: what Parley runs models in here)."""
        super().__init__(parent)
        self.setWindowTitle("Models")
        self.setObjectName("modelsPage")
        self.resize(1040, 540)  # every column's text whole (the window it opens over is 1100 wide)
        self.sig = _Signals(self)  # dies with the page: nothing is delivered to a deleted page
        self._scanned: list = []
        self._scanned_lock = threading.Lock()
        self.sig.fit.connect(self._on_fit)
        self.sig.speed.connect(self._on_speed)
        self.sig.params.connect(self._on_params)
        self.data_dir = data_dir  # where the engine keeps this machine's measured speeds
        self.sig.installed.connect(self._take_scan)
        self.sig.progress.connect(self._on_progress)
        self.sig.done.connect(self._on_done)
        self.sig.notice.connect(self._say_network_once)
        self.catalog = catalog if catalog is not None else load_catalog()
        self._catalog = {e.repo_id: e for e in self.catalog}
        self.installed: dict = {}
        self.folders: dict[str, Path] = {}  # recent model folders: loadable, never deleted from here
        self.cancel = threading.Event()
        self.downloading: str | None = None
        self.finished_path: str | None = None
        self._network_said = False
        self._network_down = threading.Event()  # one unreachable answer: later rows do not wait again

        lay = QVBoxLayout(self)
        top = QHBoxLayout()
        self.search = QLineEdit(placeholderText="Search the list, or type any repo id (ORG/NAME) and press Enter")
        self.search.setObjectName("modelSearch")
        self.search.textChanged.connect(self._filter)
        self.search.returnPressed.connect(self._search_repo)
        top.addWidget(self.search, 1)
        from engine.library.fit import BYTES_PER_PARAM, running_precision

        self.precision = QComboBox()
        self.precision.addItems(list(BYTES_PER_PARAM))  # the precisions a fit is estimated at
        self.precision.setCurrentText(precision or running_precision())
        self.precision.setToolTip(PRECISION_TIP)
        self.context = QSpinBox(minimum=512, maximum=1 << 20, singleStep=1024, value=4096, suffix=" tokens")
        for w in (QLabel("Precision"), self.precision, QLabel("Context"), self.context):
            top.addWidget(w)
        self.precision.currentIndexChanged.connect(self.refresh_fits)
        self.context.editingFinished.connect(self.refresh_fits)
        lay.addLayout(top)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setObjectName("modelTable")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QTableWidget.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        # one line a row; every column as wide as its text, the model's name taking the rest
        # (a long folder path loses its middle; the whole is in its tooltip)
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.table.itemSelectionChanged.connect(self._update_buttons)
        lay.addWidget(self.table, 1)

        self.status = QLabel()
        self.status.setObjectName("mutedLabel")
        self.status.setWordWrap(True)
        lay.addWidget(self.status)
        self.bar = QProgressBar(minimum=0, maximum=1000, textVisible=False)
        self.bar_text = QLabel()
        self.bar_text.setMinimumWidth(
            self.bar_text.fontMetrics().horizontalAdvance("000.0 MB of 000.0 MB at 000.0 MB/s, 00:00 left  ")
        )
        row = QHBoxLayout()
        row.addWidget(self.bar, 1)
        row.addWidget(self.bar_text)
        lay.addLayout(row)

        token_row = QHBoxLayout()
        self.token = QLineEdit(placeholderText="Hugging Face token for gated or private models (hf_…)")
        self.token.setEchoMode(QLineEdit.EchoMode.Password)
        save = QPushButton("Save token")
        save.clicked.connect(self._save_token)
        self.token_where = QLabel(f"stored in {token_store.where()}")
        self.token_where.setObjectName("mutedLabel")
        for widget in (self.token, save, self.token_where):
            token_row.addWidget(widget)
        lay.addLayout(token_row)

        buttons = QHBoxLayout()
        self.btn_download = QPushButton("Download")
        self.btn_cancel = QPushButton("Pause / cancel")
        self.btn_delete = QPushButton("Delete")
        self.btn_load = QPushButton("Load")
        self.btn_download.clicked.connect(self.download_selected)
        self.btn_cancel.clicked.connect(self.cancel_download)
        self.btn_delete.clicked.connect(self.delete_selected)
        self.btn_load.clicked.connect(self.load_selected)
        close = QPushButton("Close")
        close.clicked.connect(self.reject)
        buttons.addStretch(1)
        for b in (self.btn_download, self.btn_cancel, self.btn_delete, self.btn_load, close):
            buttons.addWidget(b)
        lay.addLayout(buttons)

        for e in self.catalog:
            self._add_row(e.repo_id, e.family, e.params, f"{'~' if e.approx else ''}{human_bytes(e.download_gb * 1e9)}")
        for folder in recent or []:
            self._add_folder(Path(folder))
        from engine.library.installed import installed_models

        self._on_installed(installed_models(), fit_new_rows=False)  # disk only; before the fits start
        self.refresh_fits()

    # ------------------------------------------------------------ rows

    def _add_row(self, repo_id: str, family: str, params: str, size: str) -> int:
        r = self.table.rowCount()
        self.table.insertRow(r)
        for c, text in enumerate([repo_id, family, params, size, "…", "", ""]):
            self.table.setItem(r, c, QTableWidgetItem(text))
        self._cell(r, 0).setToolTip(repo_id)
        self._cell(r, COL_SPEED).setToolTip(SPEED_TIP)
        return r

    def _cell(self, row: int, col: int) -> QTableWidgetItem:
        """The item _add_row put in each cell of a row."""
        item = self.table.item(row, col)
        if item is None:
            raise LookupError(f"the models table has no item at row {row}, column {col}")
        return item

    def _add_folder(self, folder: Path) -> None:
        from engine.library.repo_check import read_json

        config = read_json(folder / "config.json")
        if config is None or str(folder) in self.folders:
            return
        size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        r = self._add_row(str(folder), config.get("model_type", "?"), "", human_bytes(size))
        self._cell(r, COL_INSTALLED).setText("✓ folder")
        self.folders[str(folder)] = folder

    def row_of(self, repo_id: str) -> int | None:
        for r in range(self.table.rowCount()):
            if self._cell(r, 0).text() == repo_id:
                return r
        return None

    def selected_repo(self) -> str | None:
        rows = self.table.selectionModel().selectedRows()
        return self._cell(rows[0].row(), 0).text() if rows else None

    def _filter(self, text: str) -> None:
        needle = text.strip().lower()
        for r in range(self.table.rowCount()):
            hay = " ".join(self._cell(r, c).text().lower() for c in range(3))
            self.table.setRowHidden(r, bool(needle) and needle not in hay)

    def _search_repo(self) -> None:
        repo_id = self.search.text().strip()
        if not is_repo_id(repo_id):
            self._say(f"{repo_id!r} is not a repo id (ORG/NAME)")
            return
        r = self.row_of(repo_id)
        if r is None:
            r = self._add_row(repo_id, "?", "", "?")
            args = (self.precision.currentText(), self.context.value())
            self._background(lambda: self._fit_one(repo_id, *args))
        self.table.setRowHidden(r, False)
        self.table.selectRow(r)

    # ------------------------------------------------------------ background work

    def _background(self, fn) -> None:
        t = threading.Thread(target=fn, daemon=True, name="models-page")
        self._threads = [x for x in getattr(self, "_threads", []) if x.is_alive()] + [t]
        t.start()

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Join the background work (Hub requests time out on their own); True when none is left."""
        for t in list(getattr(self, "_threads", [])):
            t.join(timeout_s)
        return not any(t.is_alive() for t in getattr(self, "_threads", []))

    def _emit(self, name: str, *args) -> None:
        try:
            getattr(self.sig, name).emit(*args)
        except RuntimeError:  # the page was closed and deleted while this worker ran
            pass

    def _scan_installed(self) -> None:
        from engine.library.installed import installed_models

        found = installed_models()
        with self._scanned_lock:
            self._scanned = found
        self._emit("installed")

    def _take_scan(self) -> None:
        with self._scanned_lock:
            found = self._scanned
        self._on_installed(found)

    def _emit_progress(self, p) -> None:
        self._emit(
            "progress",
            float(p.done_bytes),
            float(p.total_bytes),
            float(p.speed_bps),
            -1.0 if p.eta_s is None else float(p.eta_s),
            p.file,
        )

    def refresh_fits(self) -> None:
        repos = [self._cell(r, 0).text() for r in range(self.table.rowCount())]
        args = (self.precision.currentText(), self.context.value())  # read on the GUI thread
        # the size and folder check come once; a precision or context change only redoes the fit
        first = not getattr(self, "_planned", False)
        self._planned = True
        self._background(lambda: self._fit_all(repos, *args, with_plan=first))

    def _fit_all(self, repos: list[str], precision: str, context: int, with_plan: bool) -> None:
        # catalog rows first, from the catalog's numbers (no network, no transformers): each row has
        # an estimate at once, replaced by the one from config.json when the Hub answers
        for repo in repos:
            self._fit_from_catalog(repo, precision, context)
        for repo in repos:
            self._fit_one(repo, precision, context, with_plan)

    def _fit_from_catalog(self, repo_id: str, precision: str, context: int) -> bool:
        """Emit the catalog's estimate for a catalog model not on disk; False when there is none."""
        from engine.library.fit import estimate_fit_from_catalog

        entry = self._catalog.get(repo_id)
        if entry is None or repo_id in self.installed or repo_id in self.folders:
            return False
        try:
            fit = estimate_fit_from_catalog(entry, precision, context)
        except ValueError:
            return False
        self._emit(  # "~": an estimate, said in full in the tooltip (the cell stays one short line)
            "fit",
            repo_id,
            f"{fit.verdict} · needs ~{human_bytes(fit.need.total_bytes)} of {human_bytes(fit.free_bytes)} free",
            fit.line() + "; the model's config.json could not be fetched yet",
        )
        self._emit("speed", repo_id, UNKNOWN_SPEED)  # its sizes come with config.json
        return True

    def _fit_one(self, repo_id: str, precision: str, context: int, with_plan: bool = True) -> None:
        """Fit (and, for a model not on disk, the live size and the folder check) of one row."""
        from engine.library.fit import estimate_fit, free_device_memory, params_text
        from engine.library.remote import remote_config
        from engine.library.repo_check import read_json

        try:
            installed = self.installed.get(repo_id)
            offline = offline_forced() or self._network_down.is_set()
            if repo_id in self.folders:
                config = read_json(self.folders[repo_id] / "config.json")
            elif installed is None and with_plan and not offline:
                from engine.library.pull import plan_pull

                plan = plan_pull(repo_id, token=token_store.load_token())
                self._emit("fit", repo_id, "", f"size:{plan.total_bytes}|{plan.problem or ''}")
                config = plan.config
            else:
                config = remote_config(repo_id, installed, offline=offline, token=token_store.load_token())
            fit = estimate_fit(config or {}, precision, context, free_device_memory())
            self._emit(
                "fit",
                repo_id,
                f"{fit.verdict} · needs {human_bytes(fit.need.total_bytes)} of {human_bytes(fit.free_bytes)} free",
                fit.line(),
            )
            self._emit("params", repo_id, params_text(fit.need.params.total))
            if self.data_dir is not None and config:
                from engine.model.speed import describe

                self._emit("speed", repo_id, describe(self.data_dir, config))
        except NetworkUnreachable as exc:
            self._network_down.set()
            if not self._fit_from_catalog(repo_id, precision, context):
                self._emit("fit", repo_id, "—", str(exc))
            self._emit("notice", str(exc))
        except (LibraryError, ValueError, TypeError, KeyError) as exc:
            self._emit("fit", repo_id, "unknown", str(exc))
        except Exception as exc:  # the row says so; the other rows still get their fit
            log.exception("fit of %s failed", repo_id)
            self._emit("fit", repo_id, "unknown", f"{type(exc).__name__}: {exc}")

    def _on_fit(self, repo_id: str, text: str, tip: str) -> None:
        r = self.row_of(repo_id)
        if r is None:
            return
        if tip.startswith("size:"):
            size, problem = tip[5:].split("|", 1)
            self._cell(r, 3).setText(human_bytes(int(size)))
            if problem:
                self._cell(r, COL_INSTALLED).setText("cannot be used")
                self._cell(r, COL_INSTALLED).setToolTip(problem)
                self._say(f"{repo_id}: {problem}")
            return
        self._cell(r, COL_FIT).setText(text)
        self._cell(r, COL_FIT).setToolTip(tip)

    def _on_speed(self, repo_id: str, text: str) -> None:
        r = self.row_of(repo_id)
        if r is not None:
            self._cell(r, COL_SPEED).setText(text)

    def _on_params(self, repo_id: str, text: str) -> None:
        """A row without a parameter count (a folder, a repo id typed in) gets the one counted
        from its config.json; a catalog row keeps the catalog's."""
        r = self.row_of(repo_id)
        if r is not None and not self._cell(r, COL_PARAMS).text():
            self._cell(r, COL_PARAMS).setText(text)
            self._cell(r, COL_PARAMS).setToolTip("counted from the model's config.json")

    def _on_installed(self, models, fit_new_rows: bool = True) -> None:
        self.installed = {m.repo_id: m for m in models}
        for m in models:
            r = self.row_of(m.repo_id)
            if r is None:
                r = self._add_row(m.repo_id, m.model_type or "?", "", human_bytes(m.size_on_disk))
                if fit_new_rows:
                    self._background(
                        functools.partial(
                            self._fit_one,
                            m.repo_id,
                            self.precision.currentText(),
                            self.context.value(),
                            with_plan=False,
                        )
                    )
            self._cell(r, COL_INSTALLED).setText(f"✓ {human_bytes(m.size_on_disk)}" if m.complete else "partial")
        for r in range(self.table.rowCount()):
            name = self._cell(r, 0).text()
            if (
                name not in self.installed
                and name not in self.folders
                and self._cell(r, COL_INSTALLED).text() != "cannot be used"
            ):
                self._cell(r, COL_INSTALLED).setText("")
        self._update_buttons()

    def _say(self, text: str) -> None:
        self.status.setText(text)

    def _say_network_once(self, text: str) -> None:
        """The fit column's "network unreachable": every row meets it, the page says it once."""
        if not self._network_said:
            self._network_said = True
            self._say(f"{text} — installed models are still listed; catalog models are sized from the catalog")

    # ------------------------------------------------------------ actions

    def download_selected(self) -> None:
        repo_id = self.selected_repo()
        if not repo_id or self.downloading:
            return
        self.downloading, self.finished_path = repo_id, None
        self.cancel = threading.Event()
        self.bar.setValue(0)
        self._say(f"Checking {repo_id}…")
        self._update_buttons()
        cancel = self.cancel
        self._background(lambda: self._pull(repo_id, cancel))

    def _pull(self, repo_id: str, cancel: threading.Event) -> None:
        """Runs on a worker thread; always ends with one `done` signal, whatever goes wrong."""
        from engine.library.fetch import Cancelled
        from engine.library.pull import plan_pull, pull

        try:
            plan = plan_pull(repo_id, token=token_store.load_token())
            if plan.problem:
                self._emit("done", repo_id, "", f"{repo_id} cannot be used by Parley: {plan.problem}")
                return
            snap = pull(plan, self._emit_progress, cancel)
            self._emit("done", repo_id, str(snap), f"{repo_id} is ready: {human_bytes(plan.total_bytes)}, verified")
        except Cancelled as exc:
            self._emit("done", repo_id, "", str(exc))
        except LibraryError as exc:
            self._emit("done", repo_id, "", f"{repo_id} was not downloaded: {exc}")
        except Exception as exc:  # an OS error or a fault no library call translated: said, never silent
            log.exception("download of %s failed", repo_id)
            self._emit("done", repo_id, "", f"{repo_id} was not downloaded: {type(exc).__name__}: {exc}")

    def _on_progress(self, done: float, total: float, speed: float, eta: float, file: str) -> None:
        from engine.library.progress import Progress

        p = Progress(int(done), int(total), speed, None if eta < 0 else eta, file)
        self.bar.setValue(int(p.fraction * 1000))
        self.bar_text.setText(progress_text(p))

    def _on_done(self, repo_id: str, snapshot: str, message: str) -> None:
        self.downloading = None
        self.finished_path = snapshot or None
        if not snapshot and message.startswith("cancelled"):
            message = f"{repo_id}: paused; Download again resumes where it stopped"
        self._say(message)
        if snapshot:
            self.bar.setValue(1000)
        self._update_buttons()
        self._background(self._scan_installed)

    def cancel_download(self) -> None:
        self.cancel.set()

    def delete_selected(self) -> None:
        repo_id = self.selected_repo()
        if not repo_id or repo_id == self.downloading:
            return
        from engine.library.installed import delete_model

        try:
            freed = delete_model(repo_id)
            self._say(f"Deleted {repo_id}: {human_bytes(freed)} freed")
        except LibraryError as exc:
            self._say(str(exc))
        self._background(self._scan_installed)

    def load_selected(self) -> None:
        repo_id = self.selected_repo() or ""
        m = self.installed.get(repo_id)
        path = self.folders.get(repo_id) or (m.snapshot if m is not None and m.complete else None)
        if path is not None:
            self.loadRequested.emit(str(path))
            self.accept()

    def _save_token(self) -> None:
        if self.token.text().strip():
            self.token_where.setText(f"stored in {token_store.save_token(self.token.text())}")
            self.token.clear()

    def _update_buttons(self) -> None:
        repo_id = self.selected_repo()
        m = self.installed.get(repo_id or "")
        folder = (repo_id or "") in self.folders
        self.btn_download.setEnabled(
            bool(repo_id) and self.downloading is None and not (m and m.complete) and not folder
        )
        self.btn_cancel.setEnabled(self.downloading is not None)
        self.btn_delete.setEnabled(m is not None and repo_id != self.downloading)
        self.btn_load.setEnabled(bool(m and m.complete) or folder)

    def reject(self) -> None:
        self.cancel.set()  # closing pauses a running download (the partial file stays)
        super().reject()
