"""Which engine the window uses, and the saved servers, in QSettings (group `engine/`).

Built-in (the default) or one of several saved OpenAI-compatible servers. Their API keys are
kept apart, among the secrets (app/settings/secrets.py), under each server's address; keys an older
version left in the settings move there when the servers are read."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from PySide6.QtCore import QSettings

from engine.remote import RemoteConfig, RemoteConfigError, normalize_base_url

from .secrets import Secrets

BUILTIN = "builtin"
REMOTE = "remote"


@dataclass(frozen=True)
class SavedServer:
    url: str
    api_key: str = field(default="", repr=False)
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


def _key_name(url: str) -> str:
    return f"server-key {url}"


def load_choice(qs: QSettings) -> EngineChoice:
    raw = qs.value("engine/servers", "[]")
    secrets = Secrets.beside(qs)
    try:
        items = [d for d in (json.loads(raw) if isinstance(raw, str) else []) if isinstance(d, dict) and d.get("url")]
    except ValueError:  # a damaged value: start without saved servers rather than not at all
        items = []
    saved = []
    for d in items:
        url, key = str(d.get("url", "")), str(d.get("api_key", "") or "")
        if key:  # in the settings file, where an older version kept it: moved out
            secrets.set(_key_name(url), key)
        saved.append(SavedServer(url, key or secrets.get(_key_name(url)), str(d.get("model", ""))))
    servers = tuple(saved)
    if any(d.get("api_key") for d in items):
        _save_servers(qs, servers)
        qs.sync()
    kind = str(qs.value("engine/kind", BUILTIN))
    try:
        stored = qs.value("engine/current", 0)  # a str from an ini file, an int from the registry
        current = int(stored) if isinstance(stored, (str, int, float)) else 0
    except (TypeError, ValueError):
        current = 0
    choice = EngineChoice(kind if kind in (BUILTIN, REMOTE) else BUILTIN, servers, current)
    return choice if choice.problem() is None else EngineChoice(BUILTIN, servers, 0)


def save_choice(qs: QSettings, choice: EngineChoice) -> None:
    secrets = Secrets.beside(qs)
    kept = {s.url for s in choice.servers}
    for old in load_choice(qs).servers:  # a server removed takes its key with it
        if old.url not in kept:
            secrets.set(_key_name(old.url), "")
    qs.setValue("engine/kind", choice.kind)
    _save_servers(qs, choice.servers)
    qs.setValue("engine/current", choice.current)
    for s in choice.servers:
        secrets.set(_key_name(s.url), s.api_key)


def _save_servers(qs: QSettings, servers: tuple[SavedServer, ...]) -> None:
    qs.setValue("engine/servers", json.dumps([{"url": s.url, "model": s.model} for s in servers]))
