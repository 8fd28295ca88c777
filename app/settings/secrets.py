"""Secrets the window keeps: saved servers' API keys and the in-app API server's token.

In the OS keyring when one works (as the Hugging Face token is: engine/library/token_store.py),
else in a 0600 JSON file in a 0700 folder beside the settings file. Never in the settings file
itself: QSettings writes it under the usual umask (0644), readable by every user of the machine,
and that is where older versions kept them (Preferences moves them out at start).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from PySide6.QtCore import QSettings

from engine.library.token_store import os_keyring
from engine.platform.files import atomic_write
from engine.platform.paths import private_dir

SERVICE = "parley"


def settings_file(qs: QSettings) -> Path | None:
    """The file QSettings keeps its values in; None where that is the registry (Windows) or a
    plist the system manages (macOS)."""
    if qs.format() == QSettings.Format.IniFormat or sys.platform.startswith("linux"):
        return Path(qs.fileName())
    return None


class Secrets:
    """`get(name)` / `set(name, value)` ("" removes it). `folder`/`stem`: where the fallback
    file goes (`<folder>/<stem>.secrets.json`) and what sets its entries apart in the keyring."""

    def __init__(self, folder: Path, stem: str):
        self.stem = stem
        self.path = Path(folder) / f"{stem}.secrets.json"

    @classmethod
    def beside(cls, qs: QSettings) -> Secrets:
        path = settings_file(qs)
        if path is None:
            import platformdirs

            return cls(Path(platformdirs.user_config_dir("Parley", appauthor=False)), "Parley")
        return cls(path.parent, path.stem)

    def get(self, name: str) -> str:
        kr = os_keyring()
        if kr is not None:
            return kr.get_password(SERVICE, f"{self.stem}/{name}") or ""
        value = self._read().get(name, "")
        return value if isinstance(value, str) else ""

    def set(self, name: str, value: str) -> None:
        kr = os_keyring()
        if kr is not None:
            if value:
                kr.set_password(SERVICE, f"{self.stem}/{name}", value)
            elif kr.get_password(SERVICE, f"{self.stem}/{name}") is not None:
                kr.delete_password(SERVICE, f"{self.stem}/{name}")
            return
        values = self._read()
        if values.get(name, "") == value:
            return
        if value:
            values[name] = value
        else:
            values.pop(name, None)
        private_dir(self.path.parent)
        atomic_write(self.path, json.dumps(values, indent=1).encode())  # created 0600

    def _read(self) -> dict:
        try:
            values = json.loads(self.path.read_text())
        except (OSError, ValueError):  # none yet, or damaged: start without (keys are asked for again)
            return {}
        return values if isinstance(values, dict) else {}
