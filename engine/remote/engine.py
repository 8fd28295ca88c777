"""RemoteEngine: the built-in Engine's protocol over an OpenAI-compatible server.

Same public calls (start, load_model, submit, stop, add_listener, shutdown, ...) and the same
events (TurnStarted, Token, TurnDone, TurnFailed, ModelLoading/Ready/Failed), so the window
and the headless commands use either one. One worker thread sends the turns in order; the
server owns the model, its memory and its caches (prefix caching is the server's image gate).
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..protocol.events import (
    ModelFailed,
    ModelLoading,
    ModelReady,
    Notice,
    ServerReport,
    SpillState,
    SpillStatus,
    Turn,
    TurnDone,
    TurnFailed,
)
from ..protocol.settings import EngineSettings
from ..protocol.turn_stats import RemoteTurnStats
from ..protocol.worker import EngineWorker, LoadModel, ReportState, Request, RunTurn, Shutdown, TurnFailure
from .config import RemoteConfig
from .failures import describe
from .messages import chat_messages

if TYPE_CHECKING:
    import openai

    from .request import TurnRequest


class ServerError(RuntimeError):
    """A server call failed; the message is the one sentence to show."""


def make_client(cfg: RemoteConfig) -> openai.OpenAI:
    import openai  # its types take ~2 s to import: only a remote engine in use pays that, never the window's start

    return openai.OpenAI(
        base_url=cfg.base_url,
        api_key=cfg.api_key or "none",  # servers without keys ignore it; the client wants one
        max_retries=0,  # a failure is shown at once; the person retries (Retry button)
        timeout=openai.Timeout(cfg.timeout_s, connect=cfg.connect_timeout_s),
    )


def list_models(cfg: RemoteConfig, client: openai.OpenAI | None = None) -> list[str]:
    """The model names the server offers (GET /v1/models), or ServerError with why not."""
    import openai

    own = client is None
    client = client or make_client(cfg)
    try:
        page = client.models.list()
        names = [m.id for m in page.data if isinstance(getattr(m, "id", None), str)]
    except openai.APIError as exc:
        if isinstance(exc, openai.APIStatusError) and exc.status_code == 404:
            raise ServerError(
                f"The server at {cfg.server} is not an OpenAI-compatible API (no {cfg.shown_url}/models)."
            ) from None
        raise ServerError(describe(exc, cfg)) from None
    except (AttributeError, TypeError, ValueError):
        raise ServerError(
            f"The server at {cfg.server} is not an OpenAI-compatible API (its /v1/models answer is not a model list)."
        ) from None
    finally:
        if own:
            client.close()
    return names


class RemoteEngine(EngineWorker):
    thread_name = "parley-remote"

    def __init__(
        self, config: RemoteConfig, settings: EngineSettings | None = None, data_dir: str | Path | None = None
    ):
        super().__init__()
        self.config = config
        # kept so Settings can still edit the built-in engine's values while a server is in use
        self.settings = settings or EngineSettings()
        self.data_dir = Path(data_dir) if data_dir else None
        self.model_name: str | None = None  # set once the server confirmed the model
        self._client = make_client(config)
        self._report = ServerReport(config.server, config.model, "connecting")
        self._request: TurnRequest | None = None  # the running turn's request (under _request_lock), for stop()
        self._request_lock = threading.Lock()

    # ------------------------------------------------------------ public API (any thread)

    def load_model(self, path: str = "") -> None:
        """Check the server and choose its model: `path` (a model name on the server; the
        protocol's word, where the built-in engine takes a folder), else the configured one, else
        the first the server lists. Answers ModelReady or ModelFailed, as a local load does."""
        self._put(LoadModel(path))

    def _stop_running(self) -> None:
        """Close the running turn's stream now, not at its next chunk: a slow server's next
        chunk may be seconds away (issue 27: 3-4 s)."""
        with self._request_lock:
            request = self._request
        if request is not None:
            request.abort()

    def unload_encoder(self) -> None:
        self._emit(Notice("info", "The server manages its own vision encoder."))

    def spill_now(self, conversation_id: str) -> None:
        self._emit(SpillState(conversation_id, SpillStatus.REFUSED, "the server keeps its own cache (a remote engine)"))

    def forget(self, conversation_id: str) -> None:
        pass  # the server holds no conversation: each request carries the whole of it

    def update_settings(self, **changes) -> None:
        self.settings = self.settings.with_changes(changes)

    def _shut_down(self, finished: bool) -> None:
        if finished:  # else the worker still reads with it; it is a daemon
            self._client.close()

    @property
    def report(self) -> ServerReport:
        return self._report

    # ------------------------------------------------------------ worker thread

    def _loop(self) -> None:
        while True:
            request = self._next_request()
            assert request is not None  # no timeout: it waits for the next request
            if isinstance(request, Shutdown):
                return
            self._dispatch(request)  # the loop survives anything a request does

    def _handle(self, request: Request) -> None:
        match request:
            case RunTurn():
                self._do_turn(request)
            case LoadModel(path=name):
                self._do_load(name)
            case ReportState():
                self._emit(self._report)
            case _:
                raise TypeError(f"the remote engine takes no {type(request).__name__}")

    def _set_report(self, **changes) -> None:
        self._report = replace(self._report, **changes)
        self._emit(self._report)

    def _do_load(self, name: str) -> None:
        cfg = self.config
        self._emit(ModelLoading(cfg.server))
        try:
            model = self._connect(name)
        except ServerError as exc:
            self._emit(ModelFailed(cfg.server, str(exc)))
        else:
            self._emit(ModelReady(cfg.shown_url, "remote", cfg.server, "", model))

    def _connect(self, name: str) -> str:
        """Ask the server for its models and choose one: its name, else ServerError saying why not."""
        try:
            self.model_name = self._choose(name, list_models(self.config, self._client))
        except ServerError as exc:
            self.model_name = None
            self._set_report(state="failed", last_error=str(exc))
            raise
        self._set_report(model=self.model_name, state="ready", last_error="")
        return self.model_name

    def _choose(self, name: str, names: list[str]) -> str:
        """`name`, else the configured model, else the server's first; ServerError when it has none of them."""
        cfg = self.config
        wanted = (name or cfg.model).strip()
        if wanted and wanted not in names:
            offered = ", ".join(names[:8]) or "none"
            raise ServerError(f"The server at {cfg.server} has no model named {wanted!r} (it offers: {offered}).")
        if not names and not wanted:
            raise ServerError(f"The server at {cfg.server} offers no model.")
        return wanted or names[0]

    def _run_turn(self, turn: Turn, queued_at: float) -> TurnDone:
        if not turn.messages or turn.messages[-1].role != "user":
            raise ValueError("A turn must end with a user message.")
        model = self.model_name
        if model is None:  # not connected yet, or the server was away: try now
            try:
                model = self._connect("")
            except ServerError as exc:
                raise TurnFailure(str(exc)) from None
        from .request import TurnRequest  # openai: see make_client

        tid = turn.turn_id
        request = TurnRequest(
            self._client, self.config, model, turn, self._emit, lambda: self._should_stop(tid), queued_at=queued_at
        )
        with self._request_lock:
            self._request = request
        try:
            outcome = request.run(chat_messages(turn))  # a failed turn raises TurnFailure
        finally:
            with self._request_lock:
                self._request = None
        self._record(outcome.stats)
        return TurnDone(tid, turn.conversation_id, outcome.reply, [], outcome.stats, stopped=outcome.stopped)

    def _failure_line(self, exc: Exception) -> str:
        return f"The request to {self.config.server} failed ({type(exc).__name__}: {exc})"

    def _turn_failed(self, turn: Turn, message: str, partial: str = "") -> None:
        self._set_report(state="failed", last_error=message)  # the report follows the latest request
        self._emit(TurnFailed(turn.turn_id, turn.conversation_id, message, partial))

    def _record(self, stats: RemoteTurnStats) -> None:
        prompt = stats.prompt_tokens
        cached = stats.cached_tokens if stats.cached_reported else None  # unknown is not 0%
        self._set_report(
            ttft_s=stats.ttft_s,
            tokens_per_s=stats.tokens_per_s,
            cached_share=(cached / prompt) if (cached is not None and prompt) else None,
            prompt_tokens=prompt,
            turns=self._report.turns + 1,
            last_error="",
            state="ready",
        )
