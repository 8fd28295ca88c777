"""The Memory dock: device, a stacked bar by component, encoder, KV, store, counters,
and the in-app API server's activity.

Events only record the latest values; a 4 Hz timer writes them into labels created once
(rows for keys seen for the first time are added, never rebuilt), so a burst of reports
costs nothing and the encoder's idle countdown ticks smoothly between reports.
"""
from __future__ import annotations

import time
from dataclasses import asdict
from typing import Callable

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QDockWidget, QFormLayout, QGridLayout, QGroupBox, QHBoxLayout, QLabel, QPushButton,
    QScrollArea, QToolButton, QVBoxLayout, QWidget,
)

from engine.protocol.events import STATELESS_PREFIX, EncoderState, MemoryReport, SpillState
from engine.protocol.turn_stats import LocalTurnStats, TurnStats

from .memory_bar import MemoryBar, color_for, exact_bytes, human_bytes

COMPONENT_NAMES = {
    "language_model": "Language model weights",
    "vision_encoder": "Vision encoder",
    "processor": "Tokenizer and processor",
    "hot_kv": "Hot KV cache",
    "image_cache_ram": "Image cache (RAM)",
    "image_cache_disk": "Image cache (disk)",
    "kv_store_disk": "KV store (disk)",
}


def on_device(key: str) -> bool:
    """Disk-resident components are listed but not stacked in the memory bar."""
    return "disk" not in key


# The SSD store's counters (StoreCounters' fields). The first screen shows what a person asks of
# the store (how big, the last spill and restore, reuse); the rest is in Details.
STORE_MAIN = [("bytes_on_disk", "Bytes on disk", True), ("reused_bytes", "Reused bytes", True)]
STORE_DETAILS = [("blobs_on_disk", "Blocks on disk", False), ("reused_blobs", "Reused blocks", False),
                 ("blocks_written", "Blocks written", False), ("spills", "Spills", False),
                 ("restores", "Restores", False), ("restore_bytes", "Restored bytes", True),
                 ("missing_blobs", "Missing blocks", False), ("bad_blobs", "Bad blocks", False),
                 ("sessions", "Conversations stored", False)]
STORE_KEYS = STORE_MAIN + STORE_DETAILS
TURN_KEYS = [("prefill_s", "Prefill", "s"), ("decode_s", "Decode", "s"), ("encode_s", "Encode", "s"),
             ("restore_s", "Restore", "s"), ("first_token_s", "First token", "s"),
             ("tokens_per_s", "Speed", "tok/s"), ("draft_acceptance", "Drafts taken", "%"),
             ("prompt_tokens", "Prompt tokens", ""),
             ("reused_tokens", "Reused tokens", ""), ("generated_tokens", "Generated tokens", ""),
             ("image_cache_hits", "Picture cache hits", ""), ("image_cache_misses", "Picture cache misses", "")]
REFRESH_MS = 250
POLL_MS = 1000
API_KEYS = [("requests", "Requests"), ("active", "Active"), ("errors", "Errors"), ("disconnects", "Disconnects")]


def _ago(seconds: float) -> str:
    if seconds < 60:
        return f"{max(0, int(seconds))} s ago"
    if seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    return f"{seconds / 3600:.1f} h ago"


def _num(v) -> str:
    if isinstance(v, float):
        return f"{v:,.3f}".rstrip("0").rstrip(".") if abs(v) < 1000 else f"{v:,.0f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


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
            self.labels[key] = label
            self.form.addRow(title, label)
        if label.text() != text:
            label.setText(text)
        label.setToolTip(tooltip)
        return label


class MemoryDock(QDockWidget):
    reportWanted = Signal()
    unloadEncoderRequested = Signal()
    spillRequested = Signal()

    def __init__(self, title_for: Callable[[str], str] = lambda cid: cid[:8], parent=None):
        super().__init__("Memory", parent)
        self.setObjectName("vramPanel")  # the name saved window layouts know this dock by
        self.title_for = title_for
        self.report: MemoryReport | None = None
        self.encoder_state = "—"
        self.encoder_idle_left: float | None = None
        self._idle_stamp = time.monotonic()
        self.spill_states: dict[str, SpillState] = {}
        self.last_spill: tuple[float, str, str] | None = None  # (when, conversation, detail)
        self.last_stats: TurnStats | None = None  # the latest finished turn's
        self.api_state, self.api_detail = "off", ""
        self.api_activity: dict = {}
        self._dirty = False

        body = QWidget()
        lay = QVBoxLayout(body)
        lay.setContentsMargins(8, 8, 8, 8)
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

        enc = QGroupBox("Vision encoder")
        el = QHBoxLayout(enc)
        self.encoder = QLabel("—")
        self.encoder.setObjectName("encoderLabel")
        self.encoder.setWordWrap(True)
        self.unload = QPushButton("Unload encoder")
        self.unload.setEnabled(False)  # until the engine reports a resident encoder
        self.unload.clicked.connect(self.unloadEncoderRequested)
        el.addWidget(self.encoder, 1)
        el.addWidget(self.unload)
        lay.addWidget(enc)

        kv = QGroupBox("Conversations (hot KV and spills)")
        kl = QVBoxLayout(kv)
        self.kv = QLabel("none")
        self.kv.setObjectName("kvLabel")
        self.kv.setWordWrap(True)
        self.spill = QPushButton("Spill now")
        self.spill.setToolTip("Write the open conversation's KV cache to disk now")
        self.spill.clicked.connect(self.spillRequested)
        kl.addWidget(self.kv)
        kl.addWidget(self.spill, 0, Qt.AlignmentFlag.AlignLeft)
        lay.addWidget(kv)

        api = QGroupBox("API server")
        self.api_rows = _Rows(QFormLayout(api))
        self.api_rows.set("api_state", "State", "off").setWordWrap(True)
        lay.addWidget(api)

        store = QGroupBox("SSD store")
        sl = QVBoxLayout(store)
        main_rows, details = QWidget(), QWidget()
        self.store_rows = _Rows(QFormLayout(main_rows))
        self.store_details = _Rows(QFormLayout(details))
        self.details_toggle = QToolButton()
        self.details_toggle.setText("Details")
        self.details_toggle.setCheckable(True)
        self.details_toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.details_toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.details_toggle.toggled.connect(lambda on: (details.setVisible(on), self.details_toggle.setArrowType(
            Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)))
        details.setVisible(False)
        for w in (main_rows, self.details_toggle, details):
            sl.addWidget(w)
        lay.addWidget(store)
        counters = QGroupBox("Counters")
        self.counter_rows = _Rows(QFormLayout(counters))
        lay.addWidget(counters)
        turn = QGroupBox("Last turn")
        self.turn_rows = _Rows(QFormLayout(turn))
        lay.addWidget(turn)
        lay.addStretch(1)
        for key, title, _ in STORE_MAIN:
            self.store_rows.set(key, title, "—")
        self.store_rows.set("last_spill", "Last spill", "—").setWordWrap(True)
        self.store_rows.set("last_restore", "Last restore", "—")
        self.turn_rows.set("tokens_per_s", "Speed", "—")

        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setMinimumWidth(270)  # values wrap under their names; the dock yields to the chat first
        scroll.setWidget(body)
        self.setWidget(scroll)

        self._refresh = QTimer(self)
        self._refresh.setInterval(REFRESH_MS)
        self._refresh.timeout.connect(self._apply)
        self._refresh.start()
        self._poll = QTimer(self)
        self._poll.setInterval(POLL_MS)
        self._poll.timeout.connect(self._maybe_poll)
        self._poll.start()

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
        if s.state == "spilled" and s.detail != "nothing hot to spill":
            self.last_spill = (time.time(), s.conversation_id, s.detail)
        self._dirty = True

    def on_turn_stats(self, stats: TurnStats) -> None:
        """The built-in engine's turns only: a server's turn says nothing of this machine's memory
        (the server dock shows it), and its figures would sit next to the last local ones."""
        if not isinstance(stats, LocalTurnStats):
            return
        self.last_stats = stats
        self._dirty = True

    def on_api_state(self, state: str, detail: str) -> None:
        """"off" | "listening" (detail: the URL) | "failed" (detail: why)."""
        self.api_state, self.api_detail = state, detail
        self._dirty = True

    def on_api_activity(self, snapshot: dict) -> None:
        self.api_activity = dict(snapshot)
        self._dirty = True

    def on_model(self, device: str, name: str) -> None:
        self.device.setText(f"{name} on {device}")

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
        if r is not None:
            self.device.setText(f"{r.device_name} ({r.device})")
            used = r.total_bytes - r.free_bytes
            self.totals.setText(f"Total {human_bytes(r.total_bytes)} · free {human_bytes(r.free_bytes)}"
                                f" · used {human_bytes(used)}")
            self.totals.setToolTip(f"total {r.total_bytes:,} B\nfree {r.free_bytes:,} B")
            segments = [(k, int(v)) for k, v in r.components.items()]
            self.bar.set_values(self._bar_segments(r), r.total_bytes, r.free_bytes)
            for k, v in segments:
                self._legend(k, v)
            self.store_rows.set("store_state", "State", r.store_status or "in use").setWordWrap(True)
            for key, v in sorted(r.counters.items()):
                self.counter_rows.set(key, key.replace("_", " "), _num(v))
            if r.store is not None:
                store = asdict(r.store)
                store["blocks_written"] += store.pop("tails_written")  # a partial last block is a block to a person too
                store_keys = {k for k, _, _ in STORE_KEYS}
                for key, v in sorted(store.items()):
                    if key not in store_keys:
                        title = key.replace("_", " ").capitalize()
                        self.store_details.set(key, title, exact_bytes(v) if key.endswith("bytes") else _num(v))
                for rows, keys in ((self.store_rows, STORE_MAIN), (self.store_details, STORE_DETAILS)):
                    for key, title, is_bytes in keys:
                        rows.set(key, title, exact_bytes(store[key]) if is_bytes else _num(store[key]))
        self._set(self.kv, self._conversation_lines())
        last = self.last_stats
        if isinstance(last, LocalTurnStats) and last.restored_tokens:
            self.store_rows.set("last_restore", "Last restore", f"{last.restored_tokens:,} tokens in "
                                f"{last.restore_s * 1000:.0f} ms")
        if self.last_spill is not None:
            at, cid, detail = self.last_spill
            self.store_rows.set("last_spill", "Last spill", f"{self.title(cid)}: {detail} ({_ago(time.time() - at)})")
        st = last.as_dict() if last is not None else {}  # the rows are named by the stats' JSON keys
        for key, title, unit in TURN_KEYS:
            if key in st:
                v = st[key]
                if unit == "%":  # a share of draft tokens the model kept (prompt-lookup decoding)
                    text = f"{v * 100:.0f} % of {_num(st.get('draft_tokens', 0))}"
                elif unit == "s":
                    text = f"{v * 1000:.1f} ms"
                else:
                    text = f"{v:,.1f} {unit}" if unit else _num(v)
                self.turn_rows.set(key, title, text)
            elif key in self.turn_rows.labels:  # not measured in the latest turn: no older figure stays
                self.turn_rows.set(key, title, "—")
        self._apply_api()

    def _conversation_lines(self) -> str:
        """One line per conversation: its hot KV (if any) and its latest spill state."""
        hot = self.report.sessions_kv if self.report is not None else {}
        order = sorted(hot, key=lambda c: -hot[c]) + [c for c in self.spill_states if c not in hot]
        lines = []
        for cid in order:
            line = f"{self.title(cid)}: " + (exact_bytes(hot[cid]) if cid in hot else "not in memory")
            s = self.spill_states.get(cid)
            if s is not None:
                line += f" · {s.state}" + (f" — {s.detail}" if s.detail else "")
            lines.append(line)
        return "\n".join(lines) or "none"

    def title(self, conversation_id: str) -> str:
        """A window conversation's title, or "API conversation N" for an API client's session."""
        if conversation_id.startswith(STATELESS_PREFIX):  # sessions the engine keeps for API clients
            return f"API conversation {conversation_id[len(STATELESS_PREFIX):]}"
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
        text = self.encoder_state
        if self.encoder_idle_left is not None and self.encoder_state == "resident":
            left = max(0.0, self.encoder_idle_left - (time.monotonic() - self._idle_stamp))
            text += f" — unloads in {left:.0f} s if idle"
        self._set(self.encoder, text)
        self.unload.setEnabled(self.encoder_state == "resident")  # nothing to unload otherwise

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
