"""The Engine: one model-owner thread, a request queue in, events out.

Every piece of model work (load, encode, prefill, decode) runs on the owner thread, so torch
state is never shared between threads. Callers only enqueue requests and receive events.
"""
from __future__ import annotations

import itertools
from dataclasses import replace
import logging
import queue
import threading
import time
from pathlib import Path
from typing import Callable

from .events import (
    EncoderState, Event, MemoryReport, ModelFailed, ModelLoading, ModelReady, Notice, SpillState, Token, Turn,
    TurnDone, TurnFailed, TurnStarted,
)
from .conversations import Conversations
from .memory import build_report, free_for_model, model_bytes
from .model import ModelLoadError, check_folder, free_device_cache, load_model
from .paths import create_data_dir, default_data_dir
from .prompt import build_prompt, render
from .session import Session
from .settings import EngineSettings
from .spill import SessionSpiller
from .turn_runner import run_turn
from .vision.gate import GateTurnStats, PictureGate
from .picture_file import PictureError

log = logging.getLogger(__name__)

_STOP = object()


class Engine:
    def __init__(self, settings: EngineSettings | None = None, data_dir: str | Path | None = None):
        self.settings = settings or EngineSettings()
        self.data_dir = Path(data_dir) if data_dir else default_data_dir()
        create_data_dir(self.data_dir)
        self._queue: queue.Queue = queue.Queue()
        self._listeners: list[Callable[[Event], None]] = []
        self._thread: threading.Thread | None = None
        self._ids = itertools.count(1)
        self._stop_lock = threading.Lock()
        self._stop_requested: set[int] = set()
        self._current_turn: int | None = None
        self.loaded = None
        self.gate: PictureGate | None = None
        self.spiller: SessionSpiller | None = None
        self.sessions = Conversations()
        self.last_turn_stats: dict = {}
        self._active_cid: str | None = None
        self._logged_notices: set[str] = set()

    # ------------------------------------------------------------ public API (any thread)

    def add_listener(self, fn: Callable[[Event], None]) -> None:
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[Event], None]) -> None:
        if fn in self._listeners:
            self._listeners.remove(fn)

    def start(self) -> "Engine":
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="parley-model-owner", daemon=True)
            self._thread.start()
        return self

    def load_model(self, path: str) -> None:
        self._queue.put(("load", str(path)))

    def new_turn_id(self) -> int:
        return next(self._ids)

    def submit(self, turn: Turn) -> int:
        """Queue a turn; a turn_id already taken from new_turn_id() is kept."""
        if not turn.turn_id:
            turn.turn_id = next(self._ids)
        self._queue.put(("turn", turn))
        return turn.turn_id

    def stop(self, turn_id: int | None = None) -> None:
        """Stop the running turn (or a queued one) before its next token."""
        with self._stop_lock:
            target = turn_id if turn_id is not None else self._current_turn
            if target is not None:
                self._stop_requested.add(target)

    def request_memory_report(self) -> None:
        self._queue.put(("memory", None))

    def unload_encoder(self) -> None:
        self._queue.put(("unload_encoder", None))

    def spill_now(self, conversation_id: str) -> None:
        self._queue.put(("spill", conversation_id))

    def forget(self, conversation_id: str) -> None:
        self._queue.put(("forget", conversation_id))

    def update_settings(self, **changes) -> None:
        self.settings.with_changes(changes)  # validate now, in the caller's thread
        self._queue.put(("settings", changes))

    def shutdown(self, timeout: float = 30.0) -> None:
        if self._thread is None:
            return
        self.stop()
        self._queue.put(("shutdown", None))
        self._thread.join(timeout)
        self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------ owner thread

    def _emit(self, event: Event) -> None:
        if isinstance(event, Notice):
            self._log_notice(event)
        for fn in list(self._listeners):
            try:
                fn(event)
            except Exception:  # a broken listener must not take the engine down
                log.exception("engine listener failed on %s", type(event).__name__)

    def _log_notice(self, notice: Notice) -> None:
        """Notices reach the log too, each distinct one once: headless commands have no window
        to show them in, and a store failing every spill would otherwise flood the log."""
        if notice.message in self._logged_notices:
            return
        self._logged_notices.add(notice.message)
        log.log(logging.INFO if notice.level == "info" else logging.WARNING, "%s", notice.message)

    def _loop(self) -> None:
        while True:
            try:
                kind, arg = self._queue.get(timeout=self._idle_tick_s())
            except queue.Empty:
                try:
                    self._on_idle()
                except Exception as exc:  # idle work failing must not end the owner thread
                    log.exception("idle work failed")
                    self._emit(Notice("error", f"background work failed: {exc}"))
                continue
            if kind == "shutdown":
                self._on_shutdown()
                return
            try:
                handler = getattr(self, f"_do_{kind}")
                handler(arg)
            except Exception as exc:  # the loop survives anything a request does
                log.exception("engine request %s failed", kind)
                self._emit(Notice("error", f"{kind} failed: {exc}"))
            try:
                self._on_idle()  # timers are due even while requests keep coming
            except Exception:
                log.exception("idle work failed")

    def _idle_tick_s(self) -> float:
        if self.spiller is not None and self.spiller.running is not None:
            return 0.02  # a spill is waiting for its writer: look again soon
        return min(1.0, max(0.05, self.settings.elastic_idle_s / 4), max(0.05, self.settings.spill_idle_s / 4))

    def _on_idle(self) -> None:
        """Timers that run between requests (encoder unload, session spill)."""
        changed = self.gate is not None and self.gate.unload_if_idle()
        sp = self.spiller
        if sp is not None and (sp.available or sp.unavailable):  # due() retries an unavailable store
            if sp.running is None:
                due = sp.due(self.sessions, self._active_cid)
                if due is not None:
                    sp.begin(due)
            # one unit at a time, and only while no request waits: a turn is never held up
            # for more than one unit's copy
            if sp.running is not None and sp.step(more=self._queue.empty):
                changed = True
        if changed:
            self._emit(self._report())

    def _on_shutdown(self) -> None:
        self._release_model()

    def _release_model(self) -> None:
        """Let go of the model and all built on it (processor, gate and its cached features,
        encoder residency, spiller, sessions' KV) and return the device memory now. The gate and
        the spiller call back into the engine; dropping them here breaks the only cycles, so
        the model is freed by reference counting at once, not whenever the collector runs."""
        if self.spiller is not None:
            self.spiller.close(self.sessions)  # exit and model switch spill what is hot: nothing lost
        if self.gate is not None:
            self.gate.close()
        self.sessions.clear()  # KV of another model is meaningless
        device = self.loaded.device if self.loaded is not None else None
        self.loaded = self.gate = self.spiller = None
        self._active_cid = None
        free_device_cache(device)

    def _emit_encoder_state(self, state: str) -> None:
        left = self.gate.encoder_idle_left() if self.gate is not None else None
        self._emit(EncoderState(state, left))

    def _make_room(self, needed: int) -> None:
        """Before the encoder loads: if the device is short of memory, release hot KV of idle
        conversations, oldest first, never the one whose turn is running."""
        if self.loaded is None:
            return
        free, margin = free_for_model(self.loaded, self.sessions.kv_bytes(), self.settings.memory_budget_bytes)
        for s in self.sessions.idle_hot(self._active_cid):
            if free >= needed + margin:
                break
            freed = s.kv_bytes()
            self._release_session(s)
            free += freed

    def _release_session(self, session: Session) -> None:
        """Free a conversation's hot KV: spilled to SSD first when the store can take it."""
        if self.spiller is not None and self.spiller.available and session.cache is not None:
            try:
                if self.spiller.spill_blocking(session):
                    return
            except Exception:
                log.exception("spill before release failed")
        session.drop_kv()

    def _do_load(self, path: str) -> None:
        self._emit(ModelLoading(path))
        try:
            check_folder(Path(path).expanduser().resolve())  # a folder that is no model keeps the old one
        except ModelLoadError as exc:
            self._emit(ModelFailed(path, str(exc)))
            return
        try:
            # the old model goes before the new one loads: two models never share the device
            self._release_model()
            loaded = load_model(path, self.settings.device, self.settings.dtype, self.settings.weights,
                                self.settings.memory_budget_bytes)
        except ModelLoadError as exc:
            self._emit(ModelFailed(path, str(exc)))
            return
        except Exception as exc:
            log.exception("model load failed")
            self._emit(ModelFailed(path, f"Cannot load {path}: {type(exc).__name__}: {exc}"))
            return
        self.loaded = loaded
        self.spiller = SessionSpiller(loaded, self.settings, self.data_dir, self._emit)
        if self.spiller.refusal:
            self._emit(Notice("warning", "Conversations will not be spilled to disk: " + self.spiller.refusal))
        elif self.spiller.error:
            self._emit(Notice("warning", f"The KV store is unavailable ({self.spiller.error}); "
                                         "idle conversations stay in memory."))
        self.gate = PictureGate(loaded, self.settings, self.data_dir / "image-cache",
                                make_room=self._make_room, on_state=self._emit_encoder_state)
        self._emit(ModelReady(str(loaded.path), loaded.adapter.name, str(loaded.device),
                              str(loaded.dtype).replace("torch.", ""), loaded.name))
        for note in loaded.notes:  # a device or dtype other than the usual one, and why
            self._emit(Notice("warning", note))
        if loaded.weights_note:  # `auto` weights chose a smaller format: say which and why
            self._emit(Notice("info", loaded.weights_note))
        if self.gate.disk_error and self.gate.disk_error != "disabled":
            self._emit(Notice("warning", f"The picture cache on disk is unavailable ({self.gate.disk_error}); "
                                         "pictures are cached in memory only."))
        if self.gate.elastic_refused:
            self._emit(Notice("warning", "The vision encoder stays loaded: " + self.gate.elastic_refused))
        # elastic: the encoder's memory is only taken while pictures need encoding
        if not self.gate.unload():
            self._emit_encoder_state(self.gate.encoder_state)
        self._emit(self._report())

    def _do_memory(self, _arg) -> None:
        self._emit(self._report())

    def _do_forget(self, conversation_id: str) -> None:
        self.sessions.pop(conversation_id, None)
        self._emit(self._report())

    def _do_settings(self, changes: dict) -> None:
        reload = self.loaded is not None and changes.get("weights", self.settings.weights) != self.settings.weights
        self.settings = self.settings.with_changes(changes)
        if reload:  # a weight format only takes effect by loading the model again
            self._do_load(str(self.loaded.path))
            return
        if self.gate is not None:
            self.gate.apply_settings(self.settings)
            if changes.get("elastic") and self.gate.elastic_refused:
                self._emit(Notice("warning", "The vision encoder stays loaded: " + self.gate.elastic_refused))

    def _do_unload_encoder(self, _arg) -> None:
        if self.gate is None:
            return
        if not self.gate.unload():
            self._emit(Notice("info", f"The vision encoder was not unloaded: {self.gate.why_not_unloaded()}."))
        self._emit(self._report())

    def _do_spill(self, conversation_id: str) -> None:
        session = self.sessions.get(conversation_id)
        sp = self.spiller
        if sp is None or not sp.retry(now=True):  # the person asked: try a full disk again now
            why = (sp.refusal or sp.error or sp.unavailable) if sp is not None else "no model is loaded"
            self._emit(SpillState(conversation_id, "refused", why or "the store is unavailable"))
        elif session is None or session.cache is None:
            self._emit(SpillState(conversation_id, "spilled", "nothing hot to spill"))
        else:
            sp.spill_blocking(session)
        self._emit(self._report())

    def _counters(self) -> dict:
        return self.gate.stats_counters() if self.gate else {}

    def _report(self) -> MemoryReport:
        extra = {}
        state, left = "resident", None
        if self.gate is not None:
            extra["image_cache_ram"], extra["image_cache_disk"] = self.gate.cache_bytes()
            state, left = self.gate.encoder_state, self.gate.encoder_idle_left()
        counters = self._counters()
        if self.spiller is not None and self.spiller.available:
            store = self.spiller.counters()
            extra["kv_store_disk"] = int(store.get("bytes_on_disk", 0))
            counters.update({f"store_{k}": v for k, v in store.items()})
        report = build_report(self.loaded, self.sessions, extra, counters, state, left)
        report.store_status = self.spiller.status if self.spiller is not None else ""
        return report

    def _should_stop(self, turn_id: int) -> bool:
        return turn_id in self._stop_requested

    def _do_turn(self, turn: Turn) -> None:
        tid, cid = turn.turn_id, turn.conversation_id
        with self._stop_lock:
            self._current_turn = tid
        self._emit(TurnStarted(tid, cid))
        try:
            if self._should_stop(tid):
                self._emit(TurnDone(tid, cid, "", [], {}, stopped=True))
                return
            if self.loaded is None:
                self._emit(TurnFailed(tid, cid, "No model is loaded. Choose a model folder first."))
                return
            self._run_turn(turn)
        except ValueError as exc:  # PictureError included: a bad turn fails alone
            self._emit(TurnFailed(tid, cid, str(exc)))
        except Exception as exc:
            log.exception("turn %s failed", tid)
            self._emit(TurnFailed(tid, cid, f"The model failed on this turn ({type(exc).__name__}: {exc})"))
        finally:
            self._active_cid = None
            with self._stop_lock:
                self._current_turn = None
                self._stop_requested.discard(tid)

    def _run_turn(self, turn: Turn) -> None:
        tid, cid = turn.turn_id, turn.conversation_id
        if not turn.messages or turn.messages[-1].role != "user":
            raise ValueError("A turn must end with a user message.")
        loaded, gate = self.loaded, self.gate
        gstats = GateTurnStats()
        entries = [gate.lookup(p, gstats) for m in turn.messages for p in m.images]
        prompt = build_prompt(loaded, render(loaded.processor, turn.messages, turn.system_prompt), entries)
        limit = loaded.context_tokens
        if limit and len(prompt.ids) >= limit:
            raise ValueError(f"This conversation is {len(prompt.ids)} tokens long, more than the model's context of "
                             f"{limit} tokens. Start a new conversation (or send fewer pictures).")
        sampling = turn.sampling  # the caller's Turn is left as it was sent
        if limit and len(prompt.ids) + sampling.max_new_tokens > limit:
            sampling = replace(sampling, max_new_tokens=limit - len(prompt.ids))
        if not cid:  # a stateless client (the API): continue whichever of its sessions fits best
            cid = turn.conversation_id = self.sessions.match_stateless(prompt, self._release_session)
        session = self.sessions.open(cid)
        session.last_used = time.monotonic()
        session.version += 1
        self._active_cid = cid
        restored, restore_s = 0, 0.0
        if self.spiller is not None:
            self.spiller.cancel_for(cid)
            t0 = time.perf_counter()
            restored = self.spiller.restore(session, prompt)
            restore_s = time.perf_counter() - t0 if restored else 0.0
        spill_stats = self.spiller.take_turn_stats(cid) if self.spiller is not None else {}
        result = run_turn(
            loaded, session, prompt, entries, sampling,
            ensure_features=lambda es: gate.ensure_features(es, gstats),
            on_text=lambda text, tok: self._emit(Token(tid, cid, text, tok)),
            should_stop=lambda: self._should_stop(tid),
            chunk_tokens=self.settings.prefill_chunk_tokens, lookup_decoding=self.settings.lookup_decoding,
        )
        self._active_cid = None
        session.last_used = time.monotonic()
        stats = dict(result.stats)
        stats["reused_tokens"] -= restored  # reused = hot in RAM; restored = read from the SSD store
        stats.update({
            "encode_s": round(gstats.encode_s, 6),
            "encoder_loads": gstats.encoder_loads,
            "encoder_load_s": round(gstats.load_s, 6),
            "image_cache_hits": gstats.hits,
            "image_cache_ram_hits": gstats.ram_hits,
            "image_cache_disk_hits": gstats.disk_hits,
            "image_cache_misses": gstats.misses,
            "pictures_encoded": gstats.encoded,
            "encoder_resident": gate.encoder_state == "resident",
            "restored_tokens": restored,
            "restore_s": round(restore_s, 6),
            "spill_blocks_written": spill_stats.get("blocks_written", 0),
            "spill_blocks_reused": spill_stats.get("blocks_reused", 0),
            "weights": loaded.weights,
            "weight_bytes": model_bytes(loaded)[0],
        })
        self.last_turn_stats = stats
        self._emit(TurnDone(tid, cid, result.reply, result.token_ids, stats, stopped=result.stopped))
        self._emit(self._report())
