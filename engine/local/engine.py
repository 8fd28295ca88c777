"""The Engine: one model-owner thread, a request queue in, events out.

Every piece of model work (load, encode, prefill, decode) runs on the owner thread, so torch
state is never shared between threads. Callers only enqueue requests and receive events.

Importing this module, making an Engine and starting it cost no torch import in the caller's
thread: the torch-backed modules are imported by the owner thread when it starts (seconds), so
a window can show before they are loaded.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from ..device.heap_trim import keep_one_heap
from ..model.heavy_imports import heavy, import_with_torch
from ..pictures.ref import PictureRef
from ..platform.paths import create_data_dir, default_data_dir
from ..protocol.events import (
    Event,
    MemoryReport,
    ModelFailed,
    ModelLoading,
    ModelReady,
    Notice,
    PictureMarks,
    SpillState,
    SpillStatus,
    Turn,
    TurnDone,
)
from ..protocol.settings import EngineSettings
from ..protocol.worker import (
    EngineWorker,
    Listeners,
    LoadModel,
    ReportState,
    Request,
    RunTurn,
    Shutdown,
    TurnFailure,
)
from .conversations import Conversations

if TYPE_CHECKING:
    from ..model.load import LoadedModel
    from ..vision.gate import PictureGate
    from .chat_memory import ChatMemoryBoard
    from .memory_manager import MemoryManager
    from .pipeline import TurnPipeline
    from .spill_scheduler import SpillScheduler

log = logging.getLogger(__name__)


@import_with_torch
def _torch_parts() -> None:
    """The engine's torch-backed modules, imported with torch under heavy_imports' lock."""
    from ..model import load  # noqa: F401
    from ..vision import gate  # noqa: F401
    from . import chat_memory, memory_manager, pipeline, spill_scheduler  # noqa: F401


@dataclass(frozen=True)
class UnloadEncoder(Request):
    name: ClassVar[str] = "unload_encoder"


@dataclass(frozen=True)
class SpillNow(Request):
    name: ClassVar[str] = "spill"
    conversation_id: str


@dataclass(frozen=True)
class Forget(Request):
    name: ClassVar[str] = "forget"
    conversation_id: str


@dataclass(frozen=True)
class ChangeSettings(Request):
    name: ClassVar[str] = "settings"
    changes: dict


@dataclass(frozen=True)
class OpenChat(Request):
    name: ClassVar[str] = "open chat"
    conversation_id: str | None  # None: no chat is open


@dataclass(frozen=True)
class CheckPictures(Request):
    name: ClassVar[str] = "check pictures"
    pictures: tuple[PictureRef, ...]
    draft: bool  # pictures of a message being written: an encoder they need starts loading now


class LoggedListeners(Listeners):
    """Notices reach the log too, each distinct one once: headless commands have no window to
    show them in, and a store failing every spill would otherwise flood the log."""

    def __init__(self) -> None:
        super().__init__()
        self._logged: set[str] = set()
        # called after each SpillState, so where each chat's KV is follows a spill step by step
        # (set while a model is loaded; cleared with it, as it holds the model's parts)
        self.after_spill_state: Callable[[], None] | None = None

    def emit(self, event: Event) -> None:
        if isinstance(event, Notice) and event.message not in self._logged:
            self._logged.add(event.message)
            log.log(logging.INFO if event.level == "info" else logging.WARNING, "%s", event.message)
        super().emit(event)
        if isinstance(event, SpillState) and self.after_spill_state is not None:
            self.after_spill_state()


class Engine(EngineWorker):
    thread_name = "parley-model-owner"
    events: LoggedListeners

    def __init__(self, settings: EngineSettings | None = None, data_dir: str | Path | None = None):
        super().__init__(LoggedListeners())
        keep_one_heap()  # before the owner thread exists: its freed memory must be trimmable
        self.settings = settings or EngineSettings()
        self.data_dir = Path(data_dir) if data_dir else default_data_dir()
        create_data_dir(self.data_dir)
        self.loaded: LoadedModel | None = None
        self.gate: PictureGate | None = None
        self.spill_scheduler: SpillScheduler | None = None
        self.memory: MemoryManager | None = None  # make-room, spill timers, releasing sessions
        self.pipeline: TurnPipeline | None = None  # one turn, from pictures to stats
        self.board: ChatMemoryBoard | None = None  # where each conversation's KV is, told to listeners
        self.open_cid: str | None = None  # the chat open in the window (also before a model is loaded)
        self.sessions = Conversations()

    # ------------------------------------------------------------ public API (any thread)

    def load_model(self, path: str) -> None:
        self._put(LoadModel(str(path)))

    def unload_encoder(self) -> None:
        self._put(UnloadEncoder())

    def spill_now(self, conversation_id: str) -> None:
        self._put(SpillNow(conversation_id))

    def forget(self, conversation_id: str) -> None:
        self._put(Forget(conversation_id))

    def update_settings(self, **changes) -> None:
        self.settings.with_changes(changes)  # validate now, in the caller's thread
        self._put(ChangeSettings(changes))

    def open_chat(self, conversation_id: str | None) -> None:
        """The person opened this conversation: if its KV is on the SSD it is restored in the
        background (between requests, as memory allows), so its next turn starts hot."""
        self._put(OpenChat(conversation_id))

    def check_pictures(self, pictures: list[PictureRef], draft: bool = False) -> None:
        """Say which of these pictures are encoded and cached (a PictureMarks event). `draft`: they
        are in a message being written, so if one is not cached the vision encoder starts loading."""
        self._put(CheckPictures(tuple(pictures), draft))

    # ------------------------------------------------------------ owner thread

    def _loop(self) -> None:
        # torch and transformers load here, first thing on this thread (see the module docstring),
        # never under _do_load's frame (engine/model/load.py says why), under heavy_imports' lock
        try:
            heavy()
        except Exception as exc:  # a broken install: say so; each request then fails with its own line
            log.exception("importing torch/transformers failed")
            self._emit(Notice("error", f"The engine cannot start: {type(exc).__name__}: {exc}"))

        while True:
            request = self._next_request(timeout=self._idle_tick_s())
            if request is None:
                try:
                    self._on_idle()
                except Exception as exc:  # idle work failing must not end the owner thread
                    log.exception("idle work failed")
                    self._emit(Notice("error", f"background work failed: {exc}"))
                continue
            if isinstance(request, Shutdown):
                self._on_shutdown()
                return
            self._dispatch(request)  # the loop survives anything a request does
            try:
                self._publish_places()
                self._on_idle()  # timers are due even while requests keep coming
            except Exception:
                log.exception("idle work failed")

    def _handle(self, request: Request) -> None:
        match request:
            case RunTurn():
                self._do_turn(request)
            case LoadModel(path=path):
                self._do_load(path)
            case ReportState():
                self._emit(self._report())
                self._publish_places(again=True)
            case UnloadEncoder():
                self._do_unload_encoder()
            case SpillNow(conversation_id=cid):
                self._do_spill(cid)
            case Forget(conversation_id=cid):
                self.sessions.pop(cid, None)
                if self.memory is not None:
                    self.memory.resume.forget(cid)
                self._emit(self._report())
            case OpenChat(conversation_id=cid):
                self.open_cid = cid
                if self.memory is not None:
                    self.memory.resume.open(cid)
            case CheckPictures(pictures=pictures, draft=draft):
                self._do_check_pictures(pictures, draft)
            case ChangeSettings(changes=changes):
                self._do_settings(changes)
            case _:
                raise TypeError(f"the engine takes no {type(request).__name__}")

    def _idle_tick_s(self) -> float:
        from .memory_manager import idle_tick_s

        return self.memory.tick_s() if self.memory is not None else idle_tick_s(self.settings)

    def _on_idle(self) -> None:
        """Timers that run between requests (encoder unload, session spill, the open chat's restore)."""
        if self.memory is not None and self.memory.on_idle(more=self._nothing_waiting):
            self._emit(self._report())
            self._publish_places()

    def _publish_places(self, again: bool = False) -> None:
        if self.board is not None:
            self.board.publish(again)

    def _on_shutdown(self) -> None:
        self._release_model()

    def _release_model(self) -> None:
        """Let go of the model and all built on it (processor, gate and its cached features,
        encoder residency, spill scheduler, sessions' KV) and return the device memory now. Its
        parts only call downwards (tests/engine/local/test_engine_release.py), so dropping them here frees the
        model by reference counting at once, not whenever the collector runs."""
        from ..model.load import free_device_cache

        self.events.after_spill_state = None  # it holds the board, which holds the model's parts
        if self.memory is not None:
            self.memory.close()  # exit and model switch spill what is hot: nothing lost
        if self.gate is not None:
            self.gate.close()
        self.sessions.clear()  # KV of another model is meaningless
        device = self.loaded.device if self.loaded is not None else None
        self.loaded = self.gate = self.spill_scheduler = self.memory = self.pipeline = self.board = None
        free_device_cache(device)

    def _do_load(self, path: str) -> None:
        try:
            from ..model.load import ModelLoadError, check_load, load_model
            from ..vision.gate import PictureGate
            from ..vision.pictures import page_tokens
            from .chat_memory import ChatMemoryBoard
            from .memory_manager import MemoryManager
            from .pipeline import TurnPipeline
            from .rates import RATES_FILE, RateBook
            from .spill_scheduler import SpillScheduler
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
            loaded = load_model(
                path,
                self.settings.device,
                self.settings.dtype,
                self.settings.weights,
                self.settings.memory_budget_bytes,
                self.settings.elastic,
                speed_dir=self.data_dir,
            )
        except ModelLoadError as exc:
            self._emit(ModelFailed(path, str(exc)))
            return
        except Exception as exc:
            log.exception("model load failed")
            self._emit(ModelFailed(path, f"Cannot load {path}: {type(exc).__name__}: {exc}"))
            return
        self.loaded = loaded
        emit = self.events.emit  # the parts emit events; none of them holds the engine
        # rates measured on this machine: per model (and its weights and dtype) and device
        rates = RateBook(
            self.data_dir / RATES_FILE,
            hashlib.blake2b(loaded.fingerprint, digest_size=16).hexdigest(),
            str(loaded.device),
        )
        self.spill_scheduler = SpillScheduler(loaded, self.settings, self.data_dir, emit, rates)
        if self.spill_scheduler.refusal:
            self._emit(Notice("warning", "Conversations will not be spilled to disk: " + self.spill_scheduler.refusal))
        elif self.spill_scheduler.error:
            self._emit(
                Notice(
                    "warning",
                    f"The KV store is unavailable ({self.spill_scheduler.error}); idle conversations stay in memory.",
                )
            )
        self.gate = PictureGate(loaded, self.settings, self.data_dir / "image-cache", emit=emit)
        self.memory = MemoryManager(loaded, self.sessions, self.spill_scheduler, self.gate, self.settings, emit, rates)
        self.pipeline = TurnPipeline(loaded, self.gate, self.sessions, self.spill_scheduler, self.memory, rates)
        self.board = ChatMemoryBoard(self.sessions, self.spill_scheduler, self.memory.resume, rates, emit)
        self.memory.resume.measure()  # the first resume estimates come from this machine's disk
        self.memory.resume.open(self.open_cid)  # opened while the model was loading: restored now
        self.events.after_spill_state = self.board.publish
        # said before ModelReady, so whoever waits for "ready" has heard how the model was placed
        for note in loaded.notes:  # a device or dtype other than the usual one, and why
            self._emit(Notice("warning", note))
        if loaded.weights_note:  # `auto` weights chose the fastest or a smaller format: say which and why
            self._emit(Notice("info", loaded.weights_note))
        self._emit(
            ModelReady(
                str(loaded.path),
                loaded.family.name,
                str(loaded.device),
                str(loaded.dtype).replace("torch.", ""),
                loaded.name,
                context_tokens=loaded.context_tokens,
                page_tokens=page_tokens(loaded),
                weights=loaded.weights,
            )
        )
        if self.gate.disk_error and self.gate.disk_error != "disabled":
            self._emit(
                Notice(
                    "warning",
                    f"The picture cache on disk is unavailable ({self.gate.disk_error}); "
                    "pictures are cached in memory only.",
                )
            )
        if self.gate.elastic_refused:
            self._emit(Notice("warning", "The vision encoder stays loaded: " + self.gate.elastic_refused))
        # elastic: the encoder's memory is only taken while pictures need encoding
        if not self.gate.unload():
            self.gate.emit_state()
        self._emit(self._report())

    def _do_settings(self, changes: dict) -> None:
        loaded = self.loaded
        reload = changes.get("weights", self.settings.weights) != self.settings.weights
        self.settings = self.settings.with_changes(changes)
        if loaded is not None and reload:  # a weight format only takes effect by loading the model again
            self._do_load(str(loaded.path))
            return
        if self.memory is not None:
            self.memory.apply_settings(self.settings)
            self._publish_places()  # a lower store cap may have evicted conversations from the SSD
        if self.gate is not None:
            self.gate.apply_settings(self.settings)
            if changes.get("elastic") and self.gate.elastic_refused:
                self._emit(Notice("warning", "The vision encoder stays loaded: " + self.gate.elastic_refused))

    def _do_check_pictures(self, pictures: tuple[PictureRef, ...], draft: bool) -> None:
        if self.gate is None or self.memory is None:  # no model (or a load that failed before its memory manager)
            return
        places = self.gate.places(pictures)  # a clip's frames are where the clip is
        self._emit(PictureMarks(places))
        if draft and self.gate.warm_for(pictures):  # loading it now, while the person types
            needed = self.gate.encoder_load_bytes()
            if needed:
                self.memory.make_room(needed)
            self.gate.warm_up()
            self._emit(self._report())

    def _do_unload_encoder(self) -> None:
        if self.gate is None:
            return
        if not self.gate.unload():
            self._emit(Notice("info", f"The vision encoder was not unloaded: {self.gate.why_not_unloaded()}."))
        self._emit(self._report())

    def _do_spill(self, conversation_id: str) -> None:
        if self.memory is None:
            self._emit(SpillState(conversation_id, SpillStatus.REFUSED, "no model is loaded"))
        else:
            self.memory.spill_now(conversation_id)
        self._emit(self._report())

    def _report(self) -> MemoryReport:
        from .memory_manager import memory_report

        if self.memory is None:
            return memory_report(self.loaded, self.sessions)
        return self.memory.report()

    def _run_turn(self, turn: Turn, queued_at: float) -> TurnDone:
        if self.loaded is None:
            raise TurnFailure("No model is loaded. Choose a model folder first.")
        if self.pipeline is None:  # the load failed after the model itself was read (_do_load)
            raise TurnFailure("The model did not finish loading. Load it again.")
        tid = turn.turn_id
        return self.pipeline.run(turn, self.settings, self._emit, lambda: self._should_stop(tid))

    def _failure_line(self, exc: Exception) -> str:
        return f"The model failed on this turn ({type(exc).__name__}: {exc})"

    def _turn_done(self, done: TurnDone) -> None:
        if self.spill_scheduler is not None:  # the version a turn left is on the SSD before the report counts it
            self.spill_scheduler.settle_versions()
        self._emit(self._report())
