"""The Memory dock. Its first screen says in words what is in memory and why: the language model,
the vision encoder (loaded or not, and why), this chat's KV (in memory, on the SSD with its resume
estimate, being restored, or not cached), the SSD store and the last turn. Below it, the device's
memory as a bar by component; the raw counters sit behind "Details" under names a person reads.

Events only record the latest values; a 4 Hz timer writes them into labels created once
(rows for keys seen for the first time are added, never rebuilt), so a burst of reports
costs nothing and the encoder's idle countdown ticks smoothly between reports.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QBoxLayout,
    QDockWidget,
    QFormLayout,
    QGridLayout,
    QGroupBox,
    QLabel,
    QPushButton,
    QScrollArea,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from engine.protocol.events import (
    STATELESS_PREFIX,
    ChatMemory,
    EncoderState,
    EncoderStatus,
    KVPlace,
    MemoryReport,
    SpillState,
    SpillStatus,
)
from engine.protocol.turn_stats import LocalTurnStats, TurnStats

from ..sizes import exact_bytes, human_bytes
from .memory_bar import MemoryBar, color_for
from .memory_marks import ChatMemoryMarks, where_brief, where_words
from .turn_line import turn_line

# An 800-px-wide window holds the sidebar, the conversation and this dock side by side (see
# main_window.CHAT_MIN_WIDTH); wider windows give the dock more (380 px at the start).
DOCK_MIN_WIDTH = 190
COMPONENT_NAMES = {
    "language_model": "Language model weights",
    "vision_encoder": "Vision encoder",
    "processor": "Tokenizer and processor",
    "kernels": "Compiled CPU kernels",
    "hot_kv": "Hot KV cache",
    "image_cache_ram": "Image cache (RAM)",
    "image_cache_disk": "Image cache (disk)",
    "kv_store_disk": "KV store (disk)",
}


def on_device(key: str) -> bool:
    """Disk-resident components are listed but not stacked in the memory bar."""
    return "disk" not in key


# The SSD store's counters (StoreCounters' fields), named for a person.
STORE_MAIN = [("bytes_on_disk", "On disk", True), ("reused_bytes", "Not written again (shared or unchanged)", True)]
STORE_DETAILS = [
    ("sessions", "Chats stored", False),
    ("blobs_on_disk", "Blocks on disk", False),
    ("blocks_written", "Blocks written", False),
    ("reused_blobs", "Blocks not written again", False),
    ("spills", "Times a chat was saved", False),
    ("spill_failures", "Saves that failed", False),
    ("restores", "Times a chat was restored", False),
    ("restored_tokens", "Tokens restored", False),
    ("restore_bytes", "Bytes restored", True),
    ("bytes_written", "Bytes written", True),
    ("missing_blobs", "Blocks found missing (re-read instead)", False),
    ("bad_blobs", "Damaged blocks (re-read instead)", False),
    ("evicted_sessions", "Chats removed to stay under the size cap", False),
    ("host_buffer_bytes", "Save buffers in memory", True),
]
STORE_KEYS = STORE_MAIN + STORE_DETAILS
# the image gate's counters
# (listed in this order: a counter the engine gained since follows, named from its key)
PICTURE_COUNTERS = {
    "hits": "Pictures found in the cache",
    "ram_hits": "Pictures found in memory",
    "disk_hits": "Pictures found on disk",
    "misses": "Pictures not in the cache",
    "encodes": "Pictures encoded",
    "encoder_loads": "Encoder loaded for new pictures",
    "encoder_unloads": "Encoder unloaded to free memory",
    "image_cache_ram_entries": "Pictures cached in memory",
    "image_cache_disk_entries": "Pictures cached on disk",
    "image_cache_evictions": "Pictures dropped from memory (cache full)",
    "image_cache_damaged": "Damaged cache entries (encoded again)",
}
TURN_KEYS = [
    ("prefill_s", "Reading the prompt", "s"),
    ("decode_s", "Writing the reply", "s"),
    ("encode_s", "Encoding pictures", "s"),
    ("restore_s", "Restoring from SSD", "s"),
    ("first_token_s", "First word after", "s"),
    ("tokens_per_s", "Speed", "tok/s"),
    ("draft_acceptance", "Words guessed ahead", "%"),
    ("prompt_tokens", "Prompt tokens", ""),
    ("reused_tokens", "Prompt tokens already in memory", ""),
    ("restored_tokens", "Prompt tokens restored from SSD", ""),
    ("prefill_tokens", "Prompt tokens read now", ""),
    ("generated_tokens", "Reply tokens", ""),
    ("image_cache_hits", "Pictures from the cache", ""),
    ("image_cache_misses", "Pictures encoded", ""),
]
REFRESH_MS = 250
POLL_MS = 1000
API_KEYS = [("requests", "Requests"), ("active", "Active"), ("errors", "Errors"), ("disconnects", "Disconnects")]


def _ago(seconds: float) -> str:
    if seconds < 60:
        return f"{max(0, int(seconds))} s ago"
    if seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    return f"{seconds / 3600:.1f} h ago"


def _counted(key: str, count) -> str:
    """A count in words where its name is an event: "1 time", "2 times"."""
    if key.startswith("encoder_") and isinstance(count, int):
        return "1 time" if count == 1 else f"{count:,} times"
    return _num(count)


def _num(v) -> str:
    if isinstance(v, float):
        return f"{v:,.3f}".rstrip("0").rstrip(".") if abs(v) < 1000 else f"{v:,.0f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def store_counters(r: MemoryReport) -> dict:
    """The SSD store's counters from a report (empty when the store is not in use)."""
    if r.store is None:
        return {}
    out = asdict(r.store)
    out["blocks_written"] += out.pop("tails_written")  # a partial last block is a block to a person too
    return out


class _Rows:
    """Label rows keyed by name, created on first use and updated in place."""

    def __init__(self, form: QFormLayout):
        self.form = form
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)  # a narrow dock puts values under names
        self.labels: dict[str, QLabel] = {}

    def set(self, key: str, title: str, text: str, tooltip: str = "") -> QLabel:
        label = self.labels.get(key)
        if label is None:
            label = QLabel()
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            label.setObjectName(f"value_{key}")
            label.setWordWrap(True)
            self.labels[key] = label
            name = QLabel(title)
            name.setWordWrap(True)  # a long name ("Not written again …") wraps in a narrow dock
            self.form.addRow(name, label)
        if label.text() != text:
            label.setText(text)
        label.setToolTip(tooltip)
        return label


class MemoryDock(QDockWidget):
    reportWanted = Signal()
    unloadEncoderRequested = Signal()
    spillRequested = Signal()

    def __init__(
        self, title_for: Callable[[str], str] = lambda cid: cid[:8], marks: ChatMemoryMarks | None = None, parent=None
    ):
        super().__init__("Memory", parent)
        self.setObjectName("vramPanel")  # the name saved window layouts know this dock by
        self.title_for = title_for
        self.marks = marks if marks is not None else ChatMemoryMarks(self)
        self.current_id: str | None = None  # the chat open in the window
        self.model_words = "No model loaded"
        self.report: MemoryReport | None = None
        self.encoder_state = "—"
        self.encoder_idle_left: float | None = None
        self._idle_stamp = time.monotonic()
        self.spill_states: dict[str, SpillState] = {}
        self.last_spill: tuple[float, str, str] | None = None  # (when, conversation, detail)
        self.last_stats: TurnStats | None = None  # the open chat's latest turn (this session)
        self.turn_stats: dict[str, TurnStats] = {}  # conversation id -> its latest turn's stats
        self.stored_line = ""  # the open chat's last reply line from history (before any turn now)
        self.api_state, self.api_detail = "off", ""
        self.api_activity: dict = {}
        self._dirty = False

        body = QWidget()
        lay = QVBoxLayout(body)
        lay.setContentsMargins(8, 8, 8, 8)

        # ---- the first screen: what is in memory and why, in words
        words = QWidget()
        self.words = _Rows(QFormLayout(words))
        self.words.form.setContentsMargins(0, 0, 0, 0)
        for key, title in (
            ("model", "Language model"),
            ("encoder", "Vision encoder"),
            ("chat", "This chat"),
            ("store", "SSD store"),
            ("turn", "Last turn"),
        ):
            self.words.set(key, title, "—")
        self.encoder = self.words.labels["encoder"]
        self.encoder.setObjectName("encoderLabel")
        self.chat_words = self.words.labels["chat"]
        lay.addWidget(words)
        # side by side, or one above the other when the dock is too narrow for both
        self.buttons = buttons = QBoxLayout(QBoxLayout.Direction.LeftToRight)
        self.unload = QPushButton("Unload encoder")
        self.unload.setToolTip("Give the vision encoder's memory back now; a new picture loads it again")
        self.unload.setEnabled(False)  # until the engine reports a resident encoder
        self.unload.clicked.connect(self.unloadEncoderRequested)
        self.spill = QPushButton("Spill now")
        self.spill.setToolTip("Write this chat's KV cache to the SSD store now and free its memory")
        self.spill.clicked.connect(self.spillRequested)
        buttons.addWidget(self.unload)
        buttons.addWidget(self.spill)
        buttons.addStretch(1)
        lay.addLayout(buttons)

        # ---- device memory by component
        self.device = QLabel("No model loaded")
        self.device.setObjectName("deviceLabel")
        self.device.setWordWrap(True)
        self.totals = QLabel("")
        self.totals.setObjectName("totalsLabel")
        self.totals.setWordWrap(True)
        self.bar = MemoryBar()
        lay.addWidget(self.device)
        lay.addWidget(self.totals)
        lay.addWidget(self.bar)
        self.legend = QGridLayout()
        self.legend.setHorizontalSpacing(8)
        self._legend_rows: dict[str, tuple[QLabel, QLabel, QLabel]] = {}
        lay.addLayout(self.legend)

        api = QGroupBox("API server")
        self.api_rows = _Rows(QFormLayout(api))
        self.api_rows.set("api_state", "State", "off")
        lay.addWidget(api)

        # ---- Details: the counters, named for a person
        self.details_toggle = QToolButton()
        self.details_toggle.setText("Details")
        self.details_toggle.setCheckable(True)
        self.details_toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.details_toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.details = QWidget()
        dl = QVBoxLayout(self.details)
        dl.setContentsMargins(0, 0, 0, 0)
        self.details_toggle.toggled.connect(self._show_details)
        self.details.setVisible(False)
        lay.addWidget(self.details_toggle, 0, Qt.AlignmentFlag.AlignLeft)
        lay.addWidget(self.details)

        kv = QGroupBox("Chats (where each one's KV is)")
        kl = QVBoxLayout(kv)
        self.kv = QLabel("none")
        self.kv.setObjectName("kvLabel")
        self.kv.setWordWrap(True)
        kl.addWidget(self.kv)
        dl.addWidget(kv)
        store = QGroupBox("SSD store")
        sl = QVBoxLayout(store)
        main_rows, more_rows = QWidget(), QWidget()
        self.store_rows = _Rows(QFormLayout(main_rows))
        self.store_details = _Rows(QFormLayout(more_rows))
        sl.addWidget(main_rows)
        sl.addWidget(more_rows)
        dl.addWidget(store)
        counters = QGroupBox("Pictures and the encoder")
        self.counter_rows = _Rows(QFormLayout(counters))
        dl.addWidget(counters)
        turn = QGroupBox("Last turn, measured")
        self.turn_rows = _Rows(QFormLayout(turn))
        dl.addWidget(turn)
        lay.addStretch(1)
        self.store_rows.set("store_state", "State", "—")
        for key, title, _ in STORE_MAIN:
            self.store_rows.set(key, title, "—")
        self.store_rows.set("last_spill", "Last spill", "—")
        self.store_rows.set("last_restore", "Last restore", "—")
        self.turn_rows.set("tokens_per_s", "Speed", "—")

        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setMinimumWidth(DOCK_MIN_WIDTH)  # values wrap under their names; the dock yields to the chat first
        scroll.setWidget(body)
        self.setWidget(scroll)

        self.marks.changed.connect(self._mark_dirty)
        self._refresh = QTimer(self)
        self._refresh.setInterval(REFRESH_MS)
        self._refresh.timeout.connect(self._apply)
        self._refresh.start()
        self._poll = QTimer(self)
        self._poll.setInterval(POLL_MS)
        self._poll.timeout.connect(self._maybe_poll)
        self._poll.start()

    def _show_details(self, on: bool) -> None:
        self.details.setVisible(on)
        self.details_toggle.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)

    def _mark_dirty(self) -> None:
        self._dirty = True

    # ------------------------------------------------------------ events in

    def on_memory_report(self, r: MemoryReport) -> None:
        self.report = r
        self.encoder_state = r.encoder_state
        self.encoder_idle_left = r.encoder_idle_left_s
        self._idle_stamp = time.monotonic()
        self._dirty = True

    def on_encoder_state(self, e: EncoderState) -> None:
        self.encoder_state = e.state
        self.encoder_idle_left = e.idle_left_s
        self._idle_stamp = time.monotonic()
        self._dirty = True

    def on_spill_state(self, s: SpillState) -> None:
        self.spill_states[s.conversation_id] = s
        if s.state == SpillStatus.SPILLED and s.detail != "nothing hot to spill":
            self.last_spill = (time.time(), s.conversation_id, s.detail)
        self._dirty = True

    def on_turn_stats(self, stats: TurnStats, conversation_id: str | None = None) -> None:
        """The built-in engine's turns only: a server's turn says nothing of this machine's memory
        (the server dock shows it), and its figures would sit next to the last local ones.
        "Last turn" is the open chat's: another chat's turn is kept for when that chat is opened."""
        if not isinstance(stats, LocalTurnStats):
            return
        if conversation_id is not None:
            self.turn_stats[conversation_id] = stats
        if conversation_id is None or conversation_id == self.current_id:
            self.last_stats = stats
        self._dirty = True

    def on_current_chat(self, conversation_id: str | None, stored_line: str = "") -> None:
        """The chat the window shows; `stored_line` is its last reply's line from history, shown as
        "Last turn" until a turn of this session replaces it."""
        self.current_id = conversation_id or None
        self.last_stats = self.turn_stats.get(conversation_id) if conversation_id else None
        self.stored_line = stored_line
        self._dirty = True

    def on_api_state(self, state: str, detail: str) -> None:
        """ "off" | "listening" (detail: the URL) | "failed" (detail: why)."""
        self.api_state, self.api_detail = state, detail
        self._dirty = True

    def on_api_activity(self, snapshot: dict) -> None:
        self.api_activity = dict(snapshot)
        self._dirty = True

    def on_model_loading(self, name: str) -> None:
        self.model_words = f"loading {name}…"
        self._dirty = True

    def on_model(self, device: str, name: str, dtype: str = "") -> None:
        self.device.setText(f"{name} on {device}")
        self.model_words = f"{name}, {dtype} on {device}" if dtype else f"{name} on {device}"
        self._dirty = True

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        room = self.widget().width() - 16 - self.buttons.spacing()  # the body's margins
        side_by_side = self.unload.sizeHint().width() + self.spill.sizeHint().width() <= room
        direction = QBoxLayout.Direction.LeftToRight if side_by_side else QBoxLayout.Direction.TopToBottom
        if self.buttons.direction() != direction:
            self.buttons.setDirection(direction)

    def stop(self) -> None:
        """No more refreshes or polls (the window is closing)."""
        self._refresh.stop()
        self._poll.stop()

    def _maybe_poll(self) -> None:
        if self.isVisible():
            self.reportWanted.emit()

    # ------------------------------------------------------------ labels out

    def refresh_now(self) -> None:
        self._dirty = True
        self._apply()

    def _apply(self) -> None:
        self._apply_encoder()  # the countdown moves even without new events
        self._apply_api_clock()  # and so does "last request … ago"
        if not self._dirty:
            return
        self._dirty = False
        r = self.report
        store = store_counters(r) if r is not None else {}
        if r is not None:
            self.device.setText(r.device_name)  # says where: "CPU (x86_64)", "NVIDIA H200 (cuda:0)"
            used = r.total_bytes - r.free_bytes
            self.totals.setText(
                f"Total {human_bytes(r.total_bytes)} · free {human_bytes(r.free_bytes)} · used {human_bytes(used)}"
            )
            self.totals.setToolTip(f"total {r.total_bytes:,} B\nfree {r.free_bytes:,} B")
            self.bar.set_values(self._bar_segments(r), r.total_bytes, r.free_bytes)
            for k, v in r.components.items():
                self._legend(k, int(v))
            self.store_rows.set("store_state", "State", r.store_status or "in use")
            order = list(PICTURE_COUNTERS)
            for key, count in sorted(
                r.counters.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0])
            ):
                self.counter_rows.set(
                    key, PICTURE_COUNTERS.get(key, key.replace("_", " ").capitalize()), _counted(key, count)
                )
            known = {k for k, _, _ in STORE_KEYS}
            for key, v in sorted(store.items()):
                if key not in known:  # a counter the store gained since this list was written
                    self.store_details.set(
                        key, key.replace("_", " ").capitalize(), exact_bytes(v) if key.endswith("bytes") else _num(v)
                    )
            for rows, keys in ((self.store_rows, STORE_MAIN), (self.store_details, STORE_DETAILS)):
                for key, title, is_bytes in keys:
                    if key in store:
                        rows.set(key, title, exact_bytes(store[key]) if is_bytes else _num(store[key]))
        self._set(self.kv, self._conversation_lines())
        last = self.last_stats
        if isinstance(last, LocalTurnStats) and last.restored_tokens:
            took = last.restore_s + last.restore_ahead_s
            self.store_rows.set(
                "last_restore", "Last restore", f"{last.restored_tokens:,} tokens in {took * 1000:.0f} ms"
            )
        if self.last_spill is not None:
            at, cid, detail = self.last_spill
            self.store_rows.set("last_spill", "Last spill", f"{self.title(cid)}: {detail} ({_ago(time.time() - at)})")
        st = last.as_dict() if last is not None else {}  # the rows are named by the stats' JSON keys
        for key, title, unit in TURN_KEYS:
            if key in st:
                v = st[key]
                if unit == "%":  # prompt-lookup decoding: words guessed from the prompt, and how many the model kept
                    drafted = int(st.get("draft_tokens", 0))
                    text = f"{drafted:,}, {round(v * drafted):,} kept ({v * 100:.0f} %)" if drafted else "none"
                elif unit == "s":
                    text = f"{v * 1000:.1f} ms"
                else:
                    text = f"{v:,.1f} {unit}" if unit else _num(v)
                self.turn_rows.set(key, title, text)
            elif key in self.turn_rows.labels:  # not measured in the latest turn: no older figure stays
                self.turn_rows.set(key, title, "—")
        self._apply_words(r, store)
        self._apply_api()

    # ------------------------------------------------------------ the first screen

    def _apply_words(self, r: MemoryReport | None, store: dict) -> None:
        model = self.model_words
        if r is not None and r.components.get("language_model"):
            model += f" — {human_bytes(r.components['language_model'])} in memory"
        self.words.set("model", "Language model", model)
        self.words.set("chat", "This chat", self._chat_words())
        self.words.set("store", "SSD store", self._store_words(r, store))
        last = self.last_stats
        self.words.set("turn", "Last turn", turn_line(last) if last is not None else (self.stored_line or "—"))

    def _chat_words(self) -> str:
        chat = self.marks.chat(self.current_id) if self.current_id else None
        return "—" if chat is None else where_words(chat)

    def _store_words(self, r: MemoryReport | None, store: dict) -> str:
        if r is None:
            return "—"
        if r.store_status:
            return r.store_status
        if not store:
            return "not in use"
        chats = int(store.get("sessions", 0))
        text = (
            f"holds {chats} chat{'s' if chats != 1 else ''} ({human_bytes(store.get('bytes_on_disk', 0))})"
            if chats
            else "empty"
        )
        if self.last_spill is not None:
            at, cid, _ = self.last_spill
            text += f"; last saved “{self.title(cid)}” {_ago(time.time() - at)}"
        return text

    def _conversation_lines(self) -> str:
        """One line per conversation whose KV is somewhere: in memory, on the SSD, or moving."""
        hot = self.report.sessions_kv if self.report is not None else {}
        report = self.marks.report if self.marks.active else None
        chats = {c.conversation_id: c for c in report.chats} if report is not None else {}
        order = sorted(hot, key=lambda c: -hot[c]) + [c for c in chats if c not in hot]
        lines = []
        for cid in order:
            chat = chats.get(cid) or ChatMemory(cid, KVPlace.HOT)  # in the report, or hot only
            if cid not in hot and chat.place in (KVPlace.HOT, KVPlace.NOT_CACHED):
                continue
            where = where_brief(chat, hot.get(cid))
            lines.append(f"{self.title(cid)}: {where}")
        return "\n".join(lines) or "none"

    def title(self, conversation_id: str) -> str:
        """A window conversation's title, or "API conversation N" for an API client's session."""
        if conversation_id.startswith(STATELESS_PREFIX):  # sessions the engine keeps for API clients
            return f"API conversation {conversation_id[len(STATELESS_PREFIX) :]}"
        return self.title_for(conversation_id)

    def _apply_api(self) -> None:
        state, detail = self.api_state, self.api_detail
        text = {"listening": f"listening on {detail}", "failed": f"not running — {detail}"}.get(state, "off")
        self.api_rows.set("api_state", "State", text, detail if state == "failed" else "")
        act = self.api_activity
        for key, title in API_KEYS:
            if key in act:
                self.api_rows.set(f"api_{key}", title, _num(act[key]))
        self._apply_api_clock()

    def _apply_api_clock(self) -> None:
        client, at = self.api_activity.get("last_client"), self.api_activity.get("last_request_at")
        if client is None and "api_last_client" not in self.api_rows.labels:
            return
        if client is None:
            text = "—"
        else:
            when = time.strftime("%H:%M:%S", time.localtime(at)) if at else "?"
            text = f"{client} at {when}" + (f" ({_ago(time.time() - at)})" if at else "")
        self.api_rows.set("api_last_client", "Last client", text)

    def _bar_segments(self, r: MemoryReport) -> list[tuple[str, int]]:
        """Device components in order, the hot KV split by conversation (one shade each)."""
        out = []
        for key, value in r.components.items():
            if not on_device(key):
                continue
            if key == "hot_kv" and r.sessions_kv:
                for i, (cid, b) in enumerate(sorted(r.sessions_kv.items(), key=lambda kv: -kv[1])):
                    seg = f"hot_kv#{i % 3}:{cid}"
                    out.append((seg, int(b)))
                    self.bar.names[seg] = f"Hot KV, {self.title(cid)}"
            else:
                out.append((key, int(value)))
        return out

    def _apply_encoder(self) -> None:
        state = self.encoder_state
        if state == EncoderStatus.RESIDENT:
            if self.encoder_idle_left is not None:
                left = max(0.0, self.encoder_idle_left - (time.monotonic() - self._idle_stamp))
                text = f"in memory; unloads in {left:.0f} s unless a new picture comes"
            else:
                text = "in memory, kept loaded (elastic unloading is off or not possible for this model)"
        elif state == EncoderStatus.UNLOADED:
            text = "not in memory: it loads only for a picture that is not cached yet"
        elif state == EncoderStatus.LOADING:
            text = "loading: a picture that is not cached needs it"
        else:
            text = state
        self._set(self.encoder, text)
        self.unload.setEnabled(state == EncoderStatus.RESIDENT)  # nothing to unload otherwise

    def _legend(self, key: str, value: int) -> None:
        row = self._legend_rows.get(key)
        if row is None:
            swatch, name, val = QLabel(), QLabel(COMPONENT_NAMES.get(key, key.replace("_", " "))), QLabel()
            swatch.setFixedSize(12, 12)
            name.setWordWrap(True)
            swatch.setStyleSheet(f"background: {color_for(key).name()}; border-radius: 2px;")
            val.setObjectName(f"component_{key}")
            val.setAlignment(Qt.AlignmentFlag.AlignRight)
            val.setWordWrap(True)  # "4.8 MiB (5,000,192 B) — resident" wraps instead of being cut off
            n = len(self._legend_rows)
            self.legend.addWidget(swatch, n, 0)
            self.legend.addWidget(name, n, 1)
            self.legend.addWidget(val, n, 2)
            row = self._legend_rows[key] = (swatch, name, val)
        label = row[2]
        text = exact_bytes(value)
        if key == "vision_encoder":
            text += f" — {self.encoder_state}"
        self._set(label, text)

    @staticmethod
    def _set(label: QLabel, text: str) -> None:
        if label.text() != text:
            label.setText(text)

    def component_text(self, key: str) -> str:
        row = self._legend_rows.get(key)
        return row[2].text() if row else ""
