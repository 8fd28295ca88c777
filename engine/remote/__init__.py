"""The remote engine: Parley's engine protocol (a Turn in; Token / TurnDone / TurnFailed out;
stop between tokens) over any OpenAI-compatible chat-completions server (vLLM,
`transformers serve`, llama.cpp's server, another Parley). No Qt, no torch."""

from .config import RemoteConfig, RemoteConfigError, normalize_base_url
from .engine import RemoteEngine

__all__ = ["RemoteConfig", "RemoteConfigError", "RemoteEngine", "normalize_base_url"]
