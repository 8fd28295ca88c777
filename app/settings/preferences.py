"""User preferences in QSettings: sampling, system prompt, engine knobs, recent models, theme,
the in-app API server. Secrets (the API server's token) are kept apart (app/settings/secrets.py), and the
settings file is made private (0600 in a 0700 folder): it names the user's models and folders."""

from __future__ import annotations

import logging
import types
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from PySide6.QtCore import QSettings

from engine.api import ApiConfigError, check_bind
from engine.pictures.video import FrameSampling
from engine.platform.paths import private_dir, private_file
from engine.protocol.events import Sampling
from engine.protocol.settings import WEIGHT_FORMATS, EngineSettings

from .secrets import Secrets, settings_file

log = logging.getLogger(__name__)

MAX_RECENT = 8
API_TOKEN = "api-token"  # its name among the secrets
API_HOST = "127.0.0.1"
API_PORT = 8011


@dataclass(frozen=True)
class ApiConfig:
    """The OpenAI-compatible API server run inside the app (off unless the user turns it on)."""

    enabled: bool = False
    host: str = API_HOST
    port: int = API_PORT
    token: str = ""  # "" = none (allowed on loopback only)


# the API server's states, as ApiControl.stateChanged says them and the status bar shows them
OFF, LISTENING, FAILED = "off", "listening", "failed"


def config_problem(cfg: ApiConfig) -> str | None:
    """Why `cfg` cannot be served (checked before binding), or None. A disabled server is fine."""
    if not cfg.enabled:
        return None
    if not cfg.host:
        return "Enter the address to listen on (127.0.0.1 serves this machine only)."
    if not 0 < cfg.port < 65536:
        return f"The port must be between 1 and 65535 (not {cfg.port})."
    try:
        check_bind(cfg.host, cfg.token or None)
    except ApiConfigError as exc:
        if cfg.token:
            return str(exc)
        return (
            f"An API token is required to listen on {cfg.host}: other machines can reach it. "
            f"Enter a token, or use 127.0.0.1."
        )
    return None


class Preferences:
    def __init__(self, settings: QSettings | None = None):
        self.qs = settings if settings is not None else QSettings("Parley", "Parley")
        self.session_overrides: dict[str, Any] = {}  # from the command line; not written back
        self.secrets = Secrets.beside(self.qs)
        _make_private(self.qs)
        token = str(self.qs.value("api/token", "") or "").strip()
        if token:  # where an older version kept it: moved out, then gone from the file
            self.secrets.set(API_TOKEN, token)
            self.qs.remove("api/token")
            self.qs.sync()

    # ------------------------------------------------------------ sampling

    def sampling(self) -> Sampling:
        d = Sampling()
        o = self.session_overrides
        temperature = float(o.get("temperature", self.qs.value("sampling/temperature", d.temperature)))
        greedy_default = _bool(self.qs.value("sampling/greedy", d.greedy))
        return Sampling(
            greedy=bool(o.get("greedy", greedy_default)),
            temperature=temperature,
            top_p=float(o.get("top_p", self.qs.value("sampling/top_p", d.top_p))),
            max_new_tokens=int(o.get("max_new_tokens", self.qs.value("sampling/max_new_tokens", d.max_new_tokens))),
            seed=o.get("seed"),
        )

    def set_sampling(self, s: Sampling) -> None:
        self.qs.setValue("sampling/greedy", s.greedy)
        self.qs.setValue("sampling/temperature", s.temperature)
        self.qs.setValue("sampling/top_p", s.top_p)
        self.qs.setValue("sampling/max_new_tokens", s.max_new_tokens)

    def system_prompt(self) -> str:
        if "system_prompt" in self.session_overrides:
            return self.session_overrides["system_prompt"] or ""
        return str(self.qs.value("chat/system_prompt", "") or "")

    def set_system_prompt(self, text: str) -> None:
        self.qs.setValue("chat/system_prompt", text)

    # ------------------------------------------------------------ engine

    def engine_settings(self) -> EngineSettings:
        """EngineSettings from `engine/<field>`: every field of the dataclass, read as its own type.
        A field never stored, or stored with a value this version cannot read, keeps its default."""
        changes: dict[str, Any] = {}
        for name in ENGINE_FIELDS:
            raw = self.qs.value(f"engine/{name}")
            if raw is None or raw == "":
                continue
            try:
                changes[name] = _engine_value(name, raw)
            except (TypeError, ValueError):
                log.warning("ignoring stored engine setting %s=%r", name, raw)
        changes.update({k: v for k, v in self.session_overrides.items() if k in EngineSettings.field_names()})
        return EngineSettings().with_changes(changes)

    def set_engine_value(self, key: str, value) -> None:
        if key not in ENGINE_FIELDS:
            raise ValueError(f"unknown engine setting {key!r}")
        self.qs.setValue(f"engine/{key}", "None" if value is None else value)

    # ------------------------------------------------------------ paths and models

    def data_dir_override(self) -> Path | None:
        v = self.qs.value("paths/data_dir")
        return Path(v) if v else None

    def set_data_dir_override(self, path: Path | None) -> None:
        if path is None:
            self.qs.remove("paths/data_dir")
        else:
            self.qs.setValue("paths/data_dir", str(path))

    def recent_models(self) -> list[str]:
        v = self.qs.value("models/recent", [])
        if isinstance(v, str):  # an INI file gives a one-item list back as its item
            v = [v]
        if not isinstance(v, (list, tuple)):  # anything else is not a list of paths: none kept
            return []
        return [str(x) for x in v if x]

    def add_recent_model(self, path: str) -> None:
        recent = [p for p in self.recent_models() if p != path]
        self.qs.setValue("models/recent", ([path] + recent)[:MAX_RECENT])

    def last_model(self) -> str | None:
        v = self.qs.value("models/last")
        return str(v) if v else None

    def set_last_model(self, path: str | None) -> None:
        """None: no model of the person's own (the next start opens the demo)."""
        if path is None:
            self.qs.remove("models/last")
        else:
            self.qs.setValue("models/last", path)

    # ------------------------------------------------------------ API server

    def api_config(self) -> ApiConfig:
        try:
            port = int(str(self.qs.value("api/port", API_PORT)))
        except (TypeError, ValueError):
            port = API_PORT
        return ApiConfig(
            enabled=_bool(self.qs.value("api/enabled", False)),
            host=str(self.qs.value("api/host", API_HOST) or API_HOST).strip(),
            port=port if 0 < port < 65536 else API_PORT,
            token=self.secrets.get(API_TOKEN).strip(),
        )

    def set_api_config(self, cfg: ApiConfig) -> None:
        self.qs.setValue("api/enabled", cfg.enabled)
        self.qs.setValue("api/host", cfg.host)
        self.qs.setValue("api/port", cfg.port)
        self.secrets.set(API_TOKEN, cfg.token)

    # ------------------------------------------------------------ documents and video

    def document_text(self) -> bool:
        """Offer a PDF's own text alongside its pages (far fewer tokens than a page's picture)."""
        return _bool(self.qs.value("documents/pdf_text", False))

    def frame_sampling(self) -> FrameSampling:
        """How a video's frames are sampled; a stored value out of range falls back to the default."""
        d = FrameSampling()
        try:
            return FrameSampling(
                float(str(self.qs.value("video/fps", d.fps))), int(str(self.qs.value("video/max_frames", d.max_frames)))
            )
        except (TypeError, ValueError):
            return d

    def set_document_options(self, document_text: bool, sampling: FrameSampling) -> None:
        self.qs.setValue("documents/pdf_text", document_text)
        self.qs.setValue("video/fps", sampling.fps)
        self.qs.setValue("video/max_frames", sampling.max_frames)

    # ------------------------------------------------------------ look

    def theme(self) -> str:
        return str(self.qs.value("ui/theme", "system"))

    def set_theme(self, mode: str) -> None:
        self.qs.setValue("ui/theme", mode)

    def sync(self) -> None:
        self.qs.sync()


def _make_private(qs: QSettings) -> None:
    """The settings file 0600 (QSettings keeps a file's mode when it rewrites it), and its folder
    0700 when it is Parley's own (not e.g. ~/Library/Preferences)."""
    path = settings_file(qs)
    if path is None:
        return
    if path.parent.name == "Parley" or qs.format() == QSettings.Format.IniFormat:
        private_dir(path.parent)
    private_file(path)


def _engine_fields() -> dict[str, tuple[type, bool]]:
    """Each EngineSettings field: the type it holds (`int` for `int | None`) and whether it may be
    None, from the dataclass's real type hints (its annotations are strings here)."""
    hints = get_type_hints(EngineSettings)
    out = {}
    for f in fields(EngineSettings):
        hint = hints[f.name]
        union = get_args(hint) if get_origin(hint) in (Union, types.UnionType) else (hint,)
        kinds = [k for k in union if k is not type(None)]
        out[f.name] = (kinds[0], len(kinds) < len(union))
    return out


# the one list of engine settings kept in preferences: a new EngineSettings field is stored and
# read back without being named here
ENGINE_FIELDS = _engine_fields()


def engine_setting_types() -> dict[str, type]:
    return {name: kind for name, (kind, _optional) in ENGINE_FIELDS.items()}


def _engine_value(name: str, raw: Any) -> Any:
    """A stored value as its field's type. An INI file gives every value back as a string, the
    registry and plist formats their own types; "None" is a field's None (None cannot be stored)."""
    kind, optional = ENGINE_FIELDS[name]
    if str(raw) == "None":
        if not optional:
            raise ValueError(f"{name} cannot be None")
        return None
    if kind is bool:
        return _bool(raw)
    if kind is int:
        return int(str(raw))
    if kind is float:
        return float(str(raw))
    value = str(raw)
    if name == "weights" and value not in WEIGHT_FORMATS:
        return "auto"  # a format from another version loads as auto
    return value


def _bool(v) -> bool:
    if isinstance(v, str):
        return v.lower() in ("1", "true", "yes")
    return bool(v)
