"""Which engine the window uses, and the saved servers, in QSettings (group `engine/`).

Built-in (the default) or one of several saved OpenAI-compatible servers. API keys are kept
with the other preferences, as the API server's own token is."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from PySide6.QtCore import QSettings

from engine.remote import RemoteConfig, RemoteConfigError, normalize_base_url

BUILTIN = "builtin"
REMOTE = "remote"


@dataclass(frozen=True)
class SavedServer:
    url: str
    api_key: str = ""
    model: str = ""

    @property
    def label(self) -> str:
        base = self.url.removeprefix("http://").removeprefix("https://").removesuffix("/v1")
        return f"{base} · {self.model}" if self.model else base

    def config(self) -> RemoteConfig:
        return RemoteConfig.make(self.url, self.model, self.api_key)


@dataclass(frozen=True)
class EngineChoice:
    kind: str = BUILTIN  # builtin | remote
    servers: tuple[SavedServer, ...] = ()
    current: int = 0  # index into servers while kind is remote

    @property
    def server(self) -> SavedServer | None:
        if self.kind != REMOTE or not (0 <= self.current < len(self.servers)):
            return None
        return self.servers[self.current]

    def problem(self) -> str | None:
        """Why this choice cannot be used, in one sentence; None when it can."""
        if self.kind != REMOTE:
            return None
        if self.server is None:
            return "Add a server (its address) to use a remote engine."
        try:
            normalize_base_url(self.server.url)
        except RemoteConfigError as exc:
            return str(exc)
        return None


def load_choice(qs: QSettings) -> EngineChoice:
    raw = qs.value("engine/servers", "[]")
    try:
        items = json.loads(raw) if isinstance(raw, str) else []
        servers = tuple(SavedServer(str(d.get("url", "")), str(d.get("api_key", "")), str(d.get("model", "")))
                        for d in items if isinstance(d, dict) and d.get("url"))
    except ValueError:  # a damaged value: start without saved servers rather than not at all
        servers = ()
    kind = str(qs.value("engine/kind", BUILTIN))
    try:
        current = int(qs.value("engine/current", 0))
    except (TypeError, ValueError):
        current = 0
    choice = EngineChoice(kind if kind in (BUILTIN, REMOTE) else BUILTIN, servers, current)
    return choice if choice.problem() is None else EngineChoice(BUILTIN, servers, 0)


def save_choice(qs: QSettings, choice: EngineChoice) -> None:
    qs.setValue("engine/kind", choice.kind)
    qs.setValue("engine/servers", json.dumps([asdict(s) for s in choice.servers]))
    qs.setValue("engine/current", choice.current)
