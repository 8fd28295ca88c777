"""The Models page: the catalog and any repo id, whether each fits, download with progress,
pause/cancel, delete, and one click to load.

All Hub, disk and device work runs off the UI thread on two app.worker Workers made with the
page (fits, and downloads with the scans after them, so a download never waits behind a fit)
through engine.library (plain functions returning numbers). What a fit learns about a row comes
back as a typed `RowNews`; the page keeps one `RowFacts` a row. No torch here.
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass, fields
from pathlib import Path

from PySide6.QtCore import Qt, Signal
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
from engine.library.progress import Progress

from ..sizes import human_bytes
from ..worker import Job, Worker
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


@dataclass
class RowFacts:
    """What the page has learned about one row off the UI thread; None: not learned (yet)."""

    size_bytes: int | None = None  # the download's size, as the Hub lists the files today
    problem: str | None = None  # why Parley cannot use the model ("unsupported architecture ...")
    fit: str | None = None  # the Fit cell: "fits · needs 1.2 GiB of 7.6 GiB free"
    fit_tip: str | None = None  # the whole estimate behind it
    params: str | None = None  # the parameter count from config.json ("870K")
    speed: str | None = None  # expected tokens/s here, or why there is no number


@dataclass(frozen=True)
class RowNews:
    """A fit job's finding about one row: the fields it learned set, the others None."""

    repo_id: str
    facts: RowFacts


@dataclass(frozen=True)
class Unreachable:
    """A fit job met no network: the page says so once, and later rows do not wait for it."""

    message: str


@dataclass(frozen=True)
class DownloadEnd:
    """How a download ended: its snapshot folder, or None (paused, refused, failed); the sentence."""

    repo_id: str
    snapshot: str | None
    message: str


class ModelsPage(QDialog):
    loadRequested = Signal(str)  # a snapshot folder to load
    downloadProgress = Signal(object)  # engine.library.progress.Progress of the running download
    downloadFinished = Signal(object)  # DownloadEnd, after the page showed it

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
        # made once, dying with the page (nothing is delivered to a closed page); fits run one at
        # a time, so a later precision's fits always land after an earlier one's
        self.fits = Worker("models-page-fits", parent=self)
        self.downloads = Worker("models-page-downloads", parent=self)  # and the scans after them
        self.facts: dict[str, RowFacts] = {}  # repo id or folder -> what the fits learned of it
        self._planned = False  # the live sizes and folder checks were asked for (once a page)
        self.data_dir = data_dir  # where the engine keeps this machine's measured speeds
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
            self._fit_in_background(lambda job: self._fit_one(job, repo_id, *args))
        self.table.setRowHidden(r, False)
        self.table.selectRow(r)

    # ------------------------------------------------------------ background work

    def _fit_in_background(self, fn) -> None:
        self.fits.submit(fn, on_report=self._on_news)

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Wait for the background work (Hub requests time out on their own); True when none is
        left. What it found may still be on its way to the UI thread."""
        return self.fits.wait_idle(timeout_s) and self.downloads.wait_idle(timeout_s)

    def _scan_installed(self) -> None:
        from engine.library.installed import installed_models

        self.downloads.submit(lambda _job: installed_models(), on_done=self._on_installed)

    def refresh_fits(self) -> None:
        repos = [self._cell(r, 0).text() for r in range(self.table.rowCount())]
        args = (self.precision.currentText(), self.context.value())  # read on the GUI thread
        # the size and folder check come once; a precision or context change only redoes the fit
        first = not self._planned
        self._planned = True
        self._fit_in_background(lambda job: self._fit_all(job, repos, *args, with_plan=first))

    def _fit_all(self, job: Job, repos: list[str], precision: str, context: int, with_plan: bool) -> None:
        # catalog rows first, from the catalog's numbers (no network, no transformers): each row has
        # an estimate at once, replaced by the one from config.json when the Hub answers
        for repo in repos:
            self._fit_from_catalog(job, repo, precision, context)
        for repo in repos:
            self._fit_one(job, repo, precision, context, with_plan)

    def _fit_from_catalog(self, job: Job, repo_id: str, precision: str, context: int) -> bool:
        """Emit the catalog's estimate for a catalog model not on disk; False when there is none."""
        from engine.library.fit import estimate_fit_from_catalog

        entry = self._catalog.get(repo_id)
        if entry is None or repo_id in self.installed or repo_id in self.folders:
            return False
        try:
            fit = estimate_fit_from_catalog(entry, precision, context)
        except ValueError:
            return False
        # "~": an estimate, said in full in the tooltip (the cell stays one short line); no speed
        # yet: its layer sizes come with config.json
        facts = RowFacts(
            fit=f"{fit.verdict} · needs ~{human_bytes(fit.need.total_bytes)} of {human_bytes(fit.free_bytes)} free",
            fit_tip=fit.line() + "; the model's config.json could not be fetched yet",
            speed=UNKNOWN_SPEED,
        )
        job.report(RowNews(repo_id, facts))
        return True

    def _fit_one(self, job: Job, repo_id: str, precision: str, context: int, with_plan: bool = True) -> None:
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
                job.report(RowNews(repo_id, RowFacts(size_bytes=plan.total_bytes, problem=plan.problem or None)))
                config = plan.config
            else:
                config = remote_config(repo_id, installed, offline=offline, token=token_store.load_token())
            fit = estimate_fit(config or {}, precision, context, free_device_memory())
            facts = RowFacts(
                fit=f"{fit.verdict} · needs {human_bytes(fit.need.total_bytes)} of {human_bytes(fit.free_bytes)} free",
                fit_tip=fit.line(),
                params=params_text(fit.need.params.total),
            )
            if self.data_dir is not None and config:
                from engine.model.speed import describe

                facts.speed = describe(self.data_dir, config)
            job.report(RowNews(repo_id, facts))
        except NetworkUnreachable as exc:
            self._network_down.set()
            if not self._fit_from_catalog(job, repo_id, precision, context):
                job.report(RowNews(repo_id, RowFacts(fit="—", fit_tip=str(exc))))
            job.report(Unreachable(str(exc)))
        except (LibraryError, ValueError, TypeError, KeyError) as exc:
            job.report(RowNews(repo_id, RowFacts(fit="unknown", fit_tip=str(exc))))
        except Exception as exc:  # the row says so; the other rows still get their fit
            log.exception("fit of %s failed", repo_id)
            job.report(RowNews(repo_id, RowFacts(fit="unknown", fit_tip=f"{type(exc).__name__}: {exc}")))

    def _on_news(self, news: RowNews | Unreachable) -> None:
        """A fit job's finding, on the UI thread: kept in the row's facts and shown in its cells."""
        if isinstance(news, Unreachable):
            self._say_network_once(news.message)
            return
        facts = self.facts.setdefault(news.repo_id, RowFacts())
        for f in fields(RowFacts):
            value = getattr(news.facts, f.name)
            if value is not None:
                setattr(facts, f.name, value)
        r = self.row_of(news.repo_id)
        if r is None:
            return
        new = news.facts
        if new.size_bytes is not None:
            self._cell(r, 3).setText(human_bytes(new.size_bytes))
        if new.problem:
            self._cell(r, COL_INSTALLED).setText("cannot be used")
            self._cell(r, COL_INSTALLED).setToolTip(new.problem)
            self._say(f"{news.repo_id}: {new.problem}")
        if new.fit is not None:
            self._cell(r, COL_FIT).setText(new.fit)
            self._cell(r, COL_FIT).setToolTip(new.fit_tip or "")
        # a row without a parameter count (a folder, a repo id typed in) gets the one counted from
        # its config.json; a catalog row keeps the catalog's
        if new.params is not None and not self._cell(r, COL_PARAMS).text():
            self._cell(r, COL_PARAMS).setText(new.params)
            self._cell(r, COL_PARAMS).setToolTip("counted from the model's config.json")
        if new.speed is not None:
            self._cell(r, COL_SPEED).setText(new.speed)

    def _on_installed(self, models, fit_new_rows: bool = True) -> None:
        self.installed = {m.repo_id: m for m in models}
        for m in models:
            r = self.row_of(m.repo_id)
            if r is None:
                r = self._add_row(m.repo_id, m.model_type or "?", "", human_bytes(m.size_on_disk))
                if fit_new_rows:
                    self._fit_in_background(
                        functools.partial(
                            self._fit_one,
                            repo_id=m.repo_id,
                            precision=self.precision.currentText(),
                            context=self.context.value(),
                            with_plan=False,
                        )
                    )
            self._cell(r, COL_INSTALLED).setText(f"✓ {human_bytes(m.size_on_disk)}" if m.complete else "partial")
        for r in range(self.table.rowCount()):
            name = self._cell(r, 0).text()
            unusable = bool(self.facts.get(name, RowFacts()).problem)  # keeps "cannot be used"
            if name not in self.installed and name not in self.folders and not unusable:
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
        self.downloads.submit(
            lambda job: self._pull(job, repo_id, cancel), on_done=self._on_done, on_report=self._on_progress
        )

    def _pull(self, job: Job, repo_id: str, cancel: threading.Event) -> DownloadEnd:
        """Runs on a worker thread; always ends in one DownloadEnd, whatever goes wrong."""
        from engine.library.fetch import Cancelled
        from engine.library.pull import plan_pull, pull

        try:
            plan = plan_pull(repo_id, token=token_store.load_token())
            if plan.problem:
                return DownloadEnd(repo_id, None, f"{repo_id} cannot be used by Parley: {plan.problem}")
            snap = pull(plan, job.report, cancel)
            return DownloadEnd(repo_id, str(snap), f"{repo_id} is ready: {human_bytes(plan.total_bytes)}, verified")
        except Cancelled as exc:
            return DownloadEnd(repo_id, None, str(exc))
        except LibraryError as exc:
            return DownloadEnd(repo_id, None, f"{repo_id} was not downloaded: {exc}")
        except Exception as exc:  # an OS error or a fault no library call translated: said, never silent
            log.exception("download of %s failed", repo_id)
            return DownloadEnd(repo_id, None, f"{repo_id} was not downloaded: {type(exc).__name__}: {exc}")

    def _on_progress(self, p: Progress) -> None:
        self.bar.setValue(int(p.fraction * 1000))
        self.bar_text.setText(progress_text(p))
        self.downloadProgress.emit(p)

    def _on_done(self, end: DownloadEnd) -> None:
        self.downloading = None
        self.finished_path = end.snapshot
        message = end.message
        if end.snapshot is None and message.startswith("cancelled"):
            message = f"{end.repo_id}: paused; Download again resumes where it stopped"
        self._say(message)
        if end.snapshot is not None:
            self.bar.setValue(1000)
        self._update_buttons()
        self._scan_installed()
        self.downloadFinished.emit(end)

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
        self._scan_installed()

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
