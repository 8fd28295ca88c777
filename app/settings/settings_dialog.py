"""Settings: sampling, system prompt, engine idle timers and cache sizes, the API server, data folder,
theme."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from engine.pictures.video import FrameSampling
from engine.protocol.events import Sampling

from .engine_box import EngineBox
from .engine_choice import load_choice, save_choice
from .preferences import ApiConfig, Preferences, config_problem

MIB = 1 << 20
# the language model's weight format (engine/model/weights.py); labels say what each costs
WEIGHT_CHOICES = (
    ("Automatic (the fastest full precision measured here, smaller when it does not fit)", "auto"),
    ("bf16 (full precision, 2 bytes a weight)", "bf16"),
    ("fp16 (full precision, 2 bytes a weight)", "fp16"),
    ("fp32 (full precision, 4 bytes a weight)", "fp32"),
    ("int8 (about half of bf16)", "int8"),
    ("int4 (llama.cpp Q4_0's size, about 0.3 of bf16; CPU only)", "int4"),
    ("4-bit NF4 (about a third of bf16; for CUDA: on a CPU it decodes several times slower than bf16)", "4bit"),
)


def _mib_box(value_bytes: int | None, maximum: int, special: str | None = None) -> QSpinBox:
    box = QSpinBox()
    box.setRange(0, maximum)
    box.setSuffix(" MiB")
    if special:
        box.setSpecialValueText(special)  # shown for 0
    box.setValue(0 if value_bytes is None else int(value_bytes // MIB))
    return box


class SettingsDialog(QDialog):
    """`api_apply(cfg) -> error | None`, when given, is tried on OK: an API server that cannot start
    as asked keeps the dialog open with the reason shown under the API settings."""

    def __init__(
        self,
        prefs: Preferences,
        data_dir: Path,
        parent=None,
        api_apply: Callable[[ApiConfig], str | None] | None = None,
    ):
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.setObjectName("settingsDialog")
        self.prefs = prefs
        self.api_apply = api_apply
        s, es = prefs.sampling(), prefs.engine_settings()
        lay = QVBoxLayout(self)
        # one tab per group: all of them stacked were 989 px tall, OK and Cancel off a 900 px screen
        self.tabs = QTabWidget()
        self.tabs.setObjectName("settingsTabs")
        lay.addWidget(self.tabs)
        self.engine_box = EngineBox(load_choice(prefs.qs))

        gen = QGroupBox("Replies")
        f = QFormLayout(gen)
        self.greedy = QCheckBox("Always pick the most likely word (deterministic)")
        self.greedy.setChecked(s.greedy)
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.01, 2.0)
        self.temperature.setSingleStep(0.05)
        self.temperature.setValue(s.temperature)
        self.top_p = QDoubleSpinBox()
        self.top_p.setRange(0.05, 1.0)
        self.top_p.setSingleStep(0.05)
        self.top_p.setValue(s.top_p)
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 32768)
        self.max_tokens.setValue(s.max_new_tokens)
        self.system_prompt = QPlainTextEdit(prefs.system_prompt())
        self.system_prompt.setPlaceholderText("Optional instructions sent before every conversation")
        self.system_prompt.setMaximumHeight(90)
        self.greedy.toggled.connect(self._sync_enabled)
        f.addRow(self.greedy)
        f.addRow("Temperature", self.temperature)
        f.addRow("Top-p", self.top_p)
        f.addRow("Max new tokens", self.max_tokens)
        f.addRow("System prompt", self.system_prompt)

        mem = QGroupBox("Memory and caches")
        m = QFormLayout(mem)
        self.elastic_idle = QDoubleSpinBox()
        self.elastic_idle.setRange(1, 3600)
        self.elastic_idle.setSuffix(" s")
        self.elastic_idle.setValue(es.elastic_idle_s)
        self.spill_idle = QDoubleSpinBox()
        self.spill_idle.setRange(1, 86400)
        self.spill_idle.setSuffix(" s")
        self.spill_idle.setValue(es.spill_idle_s)
        self.cache_entries = QSpinBox()
        self.cache_entries.setRange(1, 100000)
        self.cache_entries.setValue(es.image_cache_entries)
        self.cache_ram = _mib_box(es.image_cache_ram_bytes, 1 << 20)
        self.cache_disk = _mib_box(es.image_cache_disk_bytes, 1 << 22)
        self.store_cap = _mib_box(es.store_cap_bytes, 1 << 24, special="automatic")
        self.weights = QComboBox()
        self.weights.setObjectName("weightsChoice")
        for label, key in WEIGHT_CHOICES:
            self.weights.addItem(label, key)
        self.weights.setCurrentIndex(max(0, self.weights.findData(es.weights)))
        self.weights.setToolTip(
            "The language model's weights; the vision encoder always stays in full precision. "
            "A change loads the model again."
        )
        m.addRow("Weights", self.weights)
        m.addRow("Unload the vision encoder after idle", self.elastic_idle)
        m.addRow("Move idle conversations to disk after", self.spill_idle)
        m.addRow("Pictures kept in the RAM cache", self.cache_entries)
        m.addRow("Picture cache in RAM", self.cache_ram)
        m.addRow("Picture cache on disk", self.cache_disk)
        m.addRow("Conversation store on disk", self.store_cap)
        self.api_box = self._build_api(prefs.api_config())

        other = QGroupBox("Storage and look")
        o = QFormLayout(other)
        row = QWidget()
        rl = QHBoxLayout(row)
        rl.setContentsMargins(0, 0, 0, 0)
        override = prefs.data_dir_override()
        self.data_dir = QLineEdit(str(override or data_dir))
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        rl.addWidget(self.data_dir, 1)
        rl.addWidget(browse)
        self._initial_data_dir = self.data_dir.text()
        o.addRow("Data folder", row)
        o.addRow("", QLabel("A new data folder is used from the next start."))
        self.theme = QComboBox()
        for label, key in (("Follow the system", "system"), ("Light", "light"), ("Dark", "dark")):
            self.theme.addItem(label, key)
        self.theme.setCurrentIndex(max(0, self.theme.findData(prefs.theme())))
        o.addRow("Theme", self.theme)
        media = self._build_media(prefs)
        for box, name in (
            (gen, "Replies"),
            (self.engine_box, "Engine"),
            (mem, "Memory and caches"),
            (media, "Documents and video"),
            (self.api_box, "API server"),
            (other, "Storage and look"),
        ):
            self._add_tab(box, name)

        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        lay.addWidget(buttons)
        self._sync_enabled()

    def _build_media(self, prefs: Preferences) -> QGroupBox:
        box = QGroupBox("Documents and video")
        f = QFormLayout(box)
        self.pdf_text = QCheckBox("Offer the PDF's text alongside its pages")
        self.pdf_text.setToolTip("The text a PDF carries costs far fewer tokens than a picture of its page")
        self.pdf_text.setChecked(prefs.document_text())
        sampling = prefs.frame_sampling()
        self.video_fps = QDoubleSpinBox()
        self.video_fps.setRange(0.1, 30.0)
        self.video_fps.setDecimals(1)
        self.video_fps.setValue(sampling.fps)
        self.video_frames = QSpinBox()
        self.video_frames.setRange(1, 512)
        self.video_frames.setValue(sampling.max_frames)
        f.addRow(self.pdf_text)
        f.addRow("Video frames per second", self.video_fps)
        f.addRow("At most this many frames of a video", self.video_frames)
        return box

    def _add_tab(self, box: QGroupBox, name: str) -> None:
        box.setTitle("")  # the tab says it
        box.setFlat(True)
        page = QWidget()
        pl = QVBoxLayout(page)
        pl.addWidget(box)
        pl.addStretch(1)
        self.tabs.addTab(page, name)

    def show_tab_of(self, widget: QWidget) -> None:
        """Bring forward the tab holding `widget` (a problem shown there must be seen)."""
        for i in range(self.tabs.count()):
            page = self.tabs.widget(i)
            if page is not None and page.isAncestorOf(widget):
                self.tabs.setCurrentIndex(i)
                return

    def _build_api(self, cfg: ApiConfig) -> QGroupBox:
        box = QGroupBox("API server")
        box.setObjectName("apiGroup")
        a = QFormLayout(box)
        self.api_enabled = QCheckBox("Serve the OpenAI-compatible API from this app")
        self.api_enabled.setChecked(cfg.enabled)
        self.api_host = QLineEdit(cfg.host)
        self.api_host.setPlaceholderText("127.0.0.1")
        self.api_host.setToolTip(
            "127.0.0.1 or localhost: this machine only. Any other address can be "
            "reached from other machines and needs a token."
        )
        self.api_port = QSpinBox()
        self.api_port.setRange(1, 65535)
        self.api_port.setValue(cfg.port)
        self.api_token = QLineEdit(cfg.token)
        self.api_token.setEchoMode(QLineEdit.EchoMode.PasswordEchoOnEdit)
        self.api_token.setPlaceholderText("needed unless the address is 127.0.0.1")
        self.api_token.setToolTip("Clients send it as 'Authorization: Bearer <token>'.")
        self.api_error = QLabel()
        self.api_error.setObjectName("problemLabel")  # the theme's colour for problems
        self.api_error.setWordWrap(True)
        self.api_error.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.api_error.hide()
        a.addRow(self.api_enabled)
        a.addRow("Address", self.api_host)
        a.addRow("Port", self.api_port)
        a.addRow("Token", self.api_token)
        a.addRow(self.api_error)
        self.api_enabled.toggled.connect(self._sync_api)
        for edit in (self.api_host, self.api_token):
            edit.textEdited.connect(self._clear_api_error)
        self.api_port.valueChanged.connect(self._clear_api_error)
        self._sync_api()
        return box

    def _sync_api(self) -> None:
        on = self.api_enabled.isChecked()
        for w in (self.api_host, self.api_port, self.api_token):
            w.setEnabled(on)
        self._clear_api_error()

    def _clear_api_error(self, *_args) -> None:
        self.api_error.hide()

    def show_api_error(self, message: str) -> None:
        self.api_error.setText(message)
        self.api_error.show()
        self.show_tab_of(self.api_error)

    def api_config(self) -> ApiConfig:
        return ApiConfig(
            enabled=self.api_enabled.isChecked(),
            host=self.api_host.text().strip(),
            port=int(self.api_port.value()),
            token=self.api_token.text().strip(),
        )

    def accept(self) -> None:
        """OK: refuse an API setting that cannot work, with the reason shown inline."""
        if self.engine_box.problem():  # shown in the Engine box
            self.show_tab_of(self.engine_box)
            return
        cfg = self.api_config()
        error = config_problem(cfg)
        if error is None and self.api_apply is not None:
            error = self.api_apply(cfg)
        if error is not None:
            self.show_api_error(error)
            if cfg.enabled and not cfg.token and "token" in error.lower():
                self.api_token.setFocus()
            return
        super().accept()

    def _sync_enabled(self) -> None:
        self.temperature.setEnabled(not self.greedy.isChecked())
        self.top_p.setEnabled(not self.greedy.isChecked())

    def _browse(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Data folder", self.data_dir.text())
        if path:
            self.data_dir.setText(path)

    def engine_changes(self) -> dict:
        """Engine settings as chosen in the dialog (all user-settable keys)."""
        cap = self.store_cap.value()
        return {
            "elastic_idle_s": float(self.elastic_idle.value()),
            "spill_idle_s": float(self.spill_idle.value()),
            "image_cache_entries": int(self.cache_entries.value()),
            "image_cache_ram_bytes": int(self.cache_ram.value()) * MIB,
            "image_cache_disk_bytes": int(self.cache_disk.value()) * MIB,
            "store_cap_bytes": None if cap == 0 else cap * MIB,
            "weights": self.weights.currentData(),
        }

    def save(self) -> dict:
        """Write everything to preferences; returns the engine settings that changed."""
        p = self.prefs
        p.set_sampling(
            Sampling(
                greedy=self.greedy.isChecked(),
                temperature=self.temperature.value(),
                top_p=self.top_p.value(),
                max_new_tokens=self.max_tokens.value(),
            )
        )
        p.set_system_prompt(self.system_prompt.toPlainText().strip())
        before = p.engine_settings()
        changes = {}
        for key, value in self.engine_changes().items():
            p.set_engine_value(key, value)
            if getattr(before, key) != value:
                changes[key] = value
        if self.data_dir.text().strip() != self._initial_data_dir:
            p.set_data_dir_override(Path(self.data_dir.text().strip()).expanduser())
        p.set_theme(self.theme.currentData())
        p.set_document_options(
            self.pdf_text.isChecked(), FrameSampling(round(self.video_fps.value(), 1), int(self.video_frames.value()))
        )
        p.set_api_config(self.api_config())
        save_choice(p.qs, self.engine_box.choice())
        p.sync()
        return changes
