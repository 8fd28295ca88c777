"""run_app: the window's entry point (main.py calls it)."""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

from PySide6.QtCore import QTimer, QtMsgType, qInstallMessageHandler
from PySide6.QtWidgets import QApplication, QMessageBox

from engine.platform.paths import DEMO_MODEL, create_data_dir, is_demo_model
from engine.protocol.events import ModelFailed, ModelReady

from ..icons import app_icon
from ..settings import Preferences
from ..theme import apply_theme
from .single_instance import SingleInstance, bring_to_front
from .startup_trace import mark

log = logging.getLogger(__name__)
STATUS_ENV = "PARLEY_STATUS_FILE"


def announce(status: str) -> None:
    """Say where the app stands ("ready <model>", "failed: <why>", "activated"): logged, and
    appended as a line to the file named by $PARLEY_STATUS_FILE for scripts that launch the app."""
    log.info("Parley %s", status)
    path = os.environ.get(STATUS_ENV)
    if path:
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write(status + "\n")
        except OSError as exc:
            log.warning("cannot write %s: %s", path, exc)


def make_application(argv: list[str] | None = None) -> QApplication:
    argv = list(argv if argv is not None else sys.argv) or ["parley"]
    argv[0] = "parley"  # X11 WM_CLASS instance (the class is the application name, "Parley")
    previous = qInstallMessageHandler(_hint_on_plugin_failure)  # Qt aborts without saying what to install
    try:
        existing = QApplication.instance()  # a QCoreApplication could not show a window
        app = existing if isinstance(existing, QApplication) else QApplication(argv)
    finally:
        qInstallMessageHandler(previous)
    app.setApplicationName("Parley")
    app.setOrganizationName("Parley")
    app.setApplicationDisplayName("Parley")
    app.setDesktopFileName("parley")
    app.setWindowIcon(app_icon())
    if sys.platform == "win32":  # its own taskbar group and icon, not python's
        try:
            import ctypes

            ctypes.windll.shell32.SetCurrentProcessExplicitAppUserModelID("Parley.Parley")
        except (AttributeError, OSError):
            pass
    return app


def _hint_on_plugin_failure(kind, _context, message: str) -> None:
    sys.stderr.write(message + "\n")
    if kind == QtMsgType.QtFatalMsg and "platform plugin" in message:
        from .display_check import qt_failed_hint

        sys.stderr.write(qt_failed_hint() + "\n")
    sys.stderr.flush()


def close_on_signals(window) -> dict:
    """SIGTERM (logout, `kill`) and Ctrl+C close the window as the user would: layout saved,
    engine stopped. Returns the previous handlers for `restore_signals`."""

    def handler(_signum, _frame):
        QTimer.singleShot(0, window.close)

    previous = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread
        return previous
    tick = QTimer(window)  # Python runs signal handlers only when it gets control
    tick.timeout.connect(lambda: None)
    tick.start(250)
    return previous


def restore_signals(previous: dict) -> None:
    for sig, old in previous.items():
        signal.signal(sig, old)


def choose_data_dir(data_dir: Path, prefs: Preferences) -> Path:
    """The data folder chosen in Settings wins over the platform default (not over --data-dir)."""
    from engine.platform.paths import default_data_dir

    override = prefs.data_dir_override()
    if override and Path(data_dir).resolve() == default_data_dir().resolve():
        return override
    return Path(data_dir)


def choose_model(model_path: str | None, prefs: Preferences) -> str:
    """An explicit path; else the model used last time, if still there; else this install's demo.
    The demo is remembered as no model at all (MainWindow), so an update or a moved install opens
    its own demo; an older Parley remembered its install's folder, read as the demo too."""
    if model_path:
        return str(model_path)
    last = prefs.last_model()
    if is_demo_model(last):
        return str(DEMO_MODEL)
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
    create_data_dir(data_dir)
    instance = SingleInstance.for_data_dir(data_dir)
    if not instance.claim():  # before anything heavy is imported or loaded
        print(f"Parley is already running with {data_dir}; brought its window forward.", file=sys.stderr)
        return 0
    apply_theme(app, prefs.theme())

    from ..connection import EngineBridge
    from ..history import History, HistoryUnavailable
    from .main_window import MainWindow

    try:
        engine_settings = prefs.engine_settings()
    except (ValueError, TypeError) as exc:  # a bad stored value must not stop the app
        log.warning("ignoring stored engine settings: %s", exc)
        from engine.protocol.settings import EngineSettings

        engine_settings = EngineSettings()
    try:
        history = History(data_dir)
    except HistoryUnavailable as exc:  # a full disk at start: one clear line, not a traceback
        print(exc, file=sys.stderr)
        QMessageBox.critical(None, "Parley", str(exc))
        return 1
    bridge = EngineBridge.create(engine_settings, data_dir, start=False)  # started once the window shows
    window = MainWindow(bridge, history, prefs, data_dir)

    def on_activated(msg: dict) -> None:
        bring_to_front(window, msg)
        announce("activated")

    def on_ready(ev: ModelReady) -> None:
        mark("ready")
        announce(f"ready {ev.name}")

    def on_failed(ev: ModelFailed) -> None:
        mark("failed")
        announce(f"failed: {ev.message}")

    instance.activated.connect(on_activated)
    bridge.modelReady.connect(on_ready)
    bridge.modelFailed.connect(on_failed)
    window.show()
    window.load_model(choose_model(model_path, prefs))  # queued until the engine starts

    def shown() -> None:  # the event loop runs: the window is up; only now does torch load
        mark("shown")
        bridge.start()

    QTimer.singleShot(0, shown)
    previous = close_on_signals(window)
    try:
        return app.exec()
    finally:
        restore_signals(previous)
        instance.close()
        window.shutdown()
        mark("saved")  # history, settings and the engine's spills are on disk: the process may end now
