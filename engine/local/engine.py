"""The Engine: one model-owner thread, a request queue in, events out.

Every piece of model work (load, encode, prefill, decode) runs on the owner thread, so torch
state is never shared between threads. Callers only enqueue requests and receive events.

Importing this module, making an Engine and starting it cost no torch import in the caller's
thread: the torch-backed modules are imported by the owner thread when it starts (seconds), so
a window can show before they are loaded.
"""
from __future__ import annotations

import logging
import queue
from pathlib import Path
from typing import TYPE_CHECKING

from ..protocol.events import (
    Event, MemoryReport, ModelFailed, ModelLoading, ModelReady, Notice, SpillState, Turn, TurnDone,
    TurnFailed, TurnStarted,
)
from .conversations import Conversations
from ..device.heap_trim import keep_one_heap
from ..model.heavy_imports import heavy
from ..platform.paths import create_data_dir, default_data_dir
from ..protocol.settings import EngineSettings
from ..protocol.turn_stats import LocalTurnStats, TurnStats
from ..protocol.worker import EngineWorker

if TYPE_CHECKING:
    from .memory_manager import MemoryManager
    from .spill_scheduler import SpillScheduler
    from .pipeline import TurnPipeline
    from ..vision.gate import PictureGate

log = logging.getLogger(__name__)

_STOP = object()


class Engine(EngineWorker):
    thread_name = "parley-model-owner"

    def __init__(self, settings: EngineSettings | None = None, data_dir: str | Path | None = None):
        super().__init__()
        keep_one_heap()  # before the owner thread exists: its freed memory must be trimmable
        self.settings = settings or EngineSettings()
        self.data_dir = Path(data_dir) if data_dir else default_data_dir()
        create_data_dir(self.data_dir)
        self.loaded = None
        self.gate: PictureGate | None = None
        self.spill_scheduler: SpillScheduler | None = None
        self.memory: MemoryManager | None = None      # make-room, spill timers, releasing sessions
        self.pipeline: TurnPipeline | None = None     # one turn, from pictures to stats
        self.sessions = Conversations()
        self.last_turn_stats: LocalTurnStats | None = None  # the latest finished turn's stats
        self._logged_notices: set[str] = set()

    # ------------------------------------------------------------ public API (any thread)

    def load_model(self, path: str) -> None:
        self._queue.put(("load", str(path)))

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

    # ------------------------------------------------------------ owner thread

    def _emit(self, event: Event) -> None:
        if isinstance(event, Notice):
            self._log_notice(event)
        super()._emit(event)

    def _log_notice(self, notice: Notice) -> None:
        """Notices reach the log too, each distinct one once: headless commands have no window
        to show them in, and a store failing every spill would otherwise flood the log."""
        if notice.message in self._logged_notices:
            return
        self._logged_notices.add(notice.message)
        log.log(logging.INFO if notice.level == "info" else logging.WARNING, "%s", notice.message)

    def _loop(self) -> None:
        # torch and transformers load here, first thing on this thread (see the module docstring),
        # never under _do_load's frame (engine/model/load.py says why), under heavy_imports' lock
        try:
            heavy()
        except Exception as exc:  # a broken install: say so; each request then fails with its own line
            log.exception("importing torch/transformers failed")
            self._emit(Notice("error", f"The engine cannot start: {type(exc).__name__}: {exc}"))

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
        from .memory_manager import idle_tick_s

        return self.memory.tick_s() if self.memory is not None else idle_tick_s(self.settings)

    def _on_idle(self) -> None:
        """Timers that run between requests (encoder unload, session spill)."""
        if self.memory is not None and self.memory.on_idle(more=self._queue.empty):
            self._emit(self._report())

    def _on_shutdown(self) -> None:
        self._release_model()

    def _release_model(self) -> None:
        """Let go of the model and all built on it (processor, gate and its cached features,
        encoder residency, spill scheduler, sessions' KV) and return the device memory now. Its
        parts only call downwards (tests/test_engine_release.py), so dropping them here frees the
        model by reference counting at once, not whenever the collector runs."""
        from ..model.load import free_device_cache

        if self.memory is not None:
            self.memory.close()  # exit and model switch spill what is hot: nothing lost
        if self.gate is not None:
            self.gate.close()
        self.sessions.clear()  # KV of another model is meaningless
        device = self.loaded.device if self.loaded is not None else None
        self.loaded = self.gate = self.spill_scheduler = self.memory = self.pipeline = None
        free_device_cache(device)

    def _do_load(self, path: str) -> None:
        try:
            from .memory_manager import MemoryManager
            from ..model.load import ModelLoadError, check_load, load_model
            from .spill_scheduler import SpillScheduler
            from .pipeline import TurnPipeline
            from ..vision.gate import PictureGate
        except ImportError as exc:  # a broken install: the window leaves "Loading…" with this line
            self._emit(ModelFailed(path, f"Cannot load {path}: the engine's libraries do not import ({exc})"))
            return

        self._emit(ModelLoading(path))
        try:
            # a folder that is no model, or settings that cannot run, keep the old model
            check_load(path, self.settings.device, self.settings.dtype, self.settings.weights)
        except ModelLoadError as exc:
            self._emit(ModelFailed(path, str(exc)))
            return
        try:
            # the old model goes before the new one loads: two models never share the device
            self._release_model()
            loaded = load_model(path, self.settings.device, self.settings.dtype, self.settings.weights,
                                self.settings.memory_budget_bytes, self.settings.elastic)
        except ModelLoadError as exc:
            self._emit(ModelFailed(path, str(exc)))
            return
        except Exception as exc:
            log.exception("model load failed")
            self._emit(ModelFailed(path, f"Cannot load {path}: {type(exc).__name__}: {exc}"))
            return
        self.loaded = loaded
        self.spill_scheduler = SpillScheduler(loaded, self.settings, self.data_dir, self._emit)
        if self.spill_scheduler.refusal:
            self._emit(Notice("warning", "Conversations will not be spilled to disk: " + self.spill_scheduler.refusal))
        elif self.spill_scheduler.error:
            self._emit(Notice("warning", f"The KV store is unavailable ({self.spill_scheduler.error}); "
                                         "idle conversations stay in memory."))
        self.gate = PictureGate(loaded, self.settings, self.data_dir / "image-cache", emit=self._emit)
        self.memory = MemoryManager(loaded, self.sessions, self.spill_scheduler, self.gate, self.settings, self._emit)
        self.pipeline = TurnPipeline(loaded, self.gate, self.sessions, self.spill_scheduler, self.memory)
        # said before ModelReady, so whoever waits for "ready" has heard how the model was placed
        for note in loaded.notes:  # a device or dtype other than the usual one, and why
            self._emit(Notice("warning", note))
        if loaded.weights_note:  # `auto` weights chose a smaller format: say which and why
            self._emit(Notice("info", loaded.weights_note))
        self._emit(ModelReady(str(loaded.path), loaded.adapter.name, str(loaded.device),
                              str(loaded.dtype).replace("torch.", ""), loaded.name))
        if self.gate.disk_error and self.gate.disk_error != "disabled":
            self._emit(Notice("warning", f"The picture cache on disk is unavailable ({self.gate.disk_error}); "
                                         "pictures are cached in memory only."))
        if self.gate.elastic_refused:
            self._emit(Notice("warning", "The vision encoder stays loaded: " + self.gate.elastic_refused))
        # elastic: the encoder's memory is only taken while pictures need encoding
        if not self.gate.unload():
            self.gate.emit_state()
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
        if self.memory is not None:
            self.memory.apply_settings(self.settings)
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
        if self.memory is None:
            self._emit(SpillState(conversation_id, "refused", "no model is loaded"))
        else:
            self.memory.spill_now(conversation_id)
        self._emit(self._report())

    def _report(self) -> MemoryReport:
        from .memory_manager import memory_report

        if self.memory is None:
            return memory_report(self.loaded, self.sessions)
        return self.memory.report()

    def _should_stop(self, turn_id: int) -> bool:
        return turn_id in self._stop_requested

    def _do_turn(self, turn: Turn) -> None:
        tid, cid = turn.turn_id, turn.conversation_id
        with self._stop_lock:
            self._current_turn = tid
        self._emit(TurnStarted(tid, cid))
        try:
            if self._should_stop(tid):
                self._emit(TurnDone(tid, cid, "", [], TurnStats(), stopped=True))
                return
            if self.loaded is None:
                self._emit(TurnFailed(tid, cid, "No model is loaded. Choose a model folder first."))
                return
            done = self.pipeline.run(turn, self.settings, self._emit, lambda: self._should_stop(tid))
            self.last_turn_stats = done.stats  # set before TurnDone goes out: waiters read it next
            self._emit(done)
            self._emit(self._report())
        except ValueError as exc:  # PictureError included: a bad turn fails alone
            self._emit(TurnFailed(tid, cid, str(exc)))
        except Exception as exc:
            log.exception("turn %s failed", tid)
            self._emit(TurnFailed(tid, cid, f"The model failed on this turn ({type(exc).__name__}: {exc})"))
        finally:
            with self._stop_lock:
                self._current_turn = None
                self._stop_requested.discard(tid)
