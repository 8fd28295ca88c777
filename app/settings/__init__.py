"""What the user chooses and the window keeps: preferences (QSettings, the in-app API server's
settings and listening states), secrets (keyring, else private files), the engine choice and its
saved servers (engine_choice, engine_box) and the Settings dialog.

`SettingsDialog` is imported on first use: start-up reads the preferences before it claims the
data folder, and a second launch that only brings the first window forward needs no dialog.
May import: the root modules (icons, theme, sizes, version)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .engine_choice import EngineChoice, load_choice
from .preferences import FAILED, LISTENING, OFF, ApiConfig, Preferences, config_problem

if TYPE_CHECKING:
    from .settings_dialog import SettingsDialog

__all__ = [
    "FAILED",
    "LISTENING",
    "OFF",
    "ApiConfig",
    "EngineChoice",
    "Preferences",
    "SettingsDialog",
    "config_problem",
    "load_choice",
]


def __getattr__(name: str):
    if name == "SettingsDialog":
        from .settings_dialog import SettingsDialog

        return SettingsDialog
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
