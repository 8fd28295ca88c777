"""run_app: the window's entry point (main.py calls it)."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

from PySide6.QtWidgets import QApplication

from .icons import app_icon
from .model_catalog import DEMO_MODEL
from .preferences import Preferences
from .theme import apply_theme

log = logging.getLogger(__name__)


def make_application(argv: list[str] | None = None) -> QApplication:
    app = QApplication.instance() or QApplication(argv if argv is not None else sys.argv)
    app.setApplicationName("Parley")
    app.setOrganizationName("Parley")
    app.setApplicationDisplayName("Parley")
    app.setDesktopFileName("parley")
    app.setWindowIcon(app_icon())
    return app


def choose_data_dir(data_dir: Path, prefs: Preferences) -> Path:
    """The data folder chosen in Settings wins over the platform default (not over --data-dir)."""
    from engine.paths import default_data_dir

    override = prefs.data_dir_override()
    if override and Path(data_dir).resolve() == default_data_dir().resolve():
        return override
    return Path(data_dir)


def choose_model(model_path: str | None, prefs: Preferences) -> str:
    """An explicit path; else the model used last time, if still there; else the demo."""
    if model_path:
        return str(model_path)
    last = prefs.last_model()
    if last and (Path(last) / "config.json").is_file():
        return last
    return str(DEMO_MODEL)


def run_app(model_path: str | None, data_dir: Path, settings: dict | None = None) -> int:
    """Create the application, engine and window, load the model, run until the window closes.

    `settings` overrides preferences for this run only: engine settings by their EngineSettings
    names, and temperature / top_p / max_new_tokens / greedy / seed / system_prompt.
    """
    app = make_application()
    prefs = Preferences()
    prefs.session_overrides = dict(settings or {})
    data_dir = choose_data_dir(Path(data_dir), prefs)
    data_dir.mkdir(parents=True, exist_ok=True)
    apply_theme(app, prefs.theme())

    from engine.history import History
    from .bridge import EngineBridge
    from .main_window import MainWindow

    try:
        engine_settings = prefs.engine_settings()
    except (ValueError, TypeError) as exc:  # a bad stored value must not stop the app
        log.warning("ignoring stored engine settings: %s", exc)
        from engine.settings import EngineSettings
        engine_settings = EngineSettings()
    history = History(data_dir)
    bridge = EngineBridge.create(engine_settings, data_dir)
    window = MainWindow(bridge, history, prefs, data_dir)
    window.show()
    window.load_model(choose_model(model_path, prefs))
    try:
        return app.exec()
    finally:
        window.shutdown()
