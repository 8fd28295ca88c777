"""The window comes before torch: launched as a desktop would (main.py, offscreen), the app's
startup trace says the window was shown while torch and transformers were not yet imported,
and the model still loads afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.shell.startup_trace import TRACE_ENV, read_trace

ROOT = Path(__file__).resolve().parents[3]


def test_read_trace_keeps_first_marks_and_skips_a_half_written_line(tmp_path):
    trace = tmp_path / "trace"
    trace.write_text("shown 10.5 heavy=none\nready 12.25 heavy=torch,transformers\nready 30.0 heavy=torch\nfai")
    assert read_trace(trace) == {"shown": (10.5, "none"), "ready": (12.25, "torch,transformers")}
    assert read_trace(tmp_path / "absent") == {}


@pytest.mark.slow
def test_window_shows_before_torch_is_imported(tmp_path, tiny_model):
    home, trace, log_path = tmp_path / "home", tmp_path / "trace", tmp_path / "app.log"
    (home / "run").mkdir(parents=True, mode=0o700)
    env = {
        **os.environ,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_DATA_HOME": str(home / "share"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "XDG_RUNTIME_DIR": str(home / "run"),
        "QT_QPA_PLATFORM": "offscreen",
        TRACE_ENV: str(trace),
    }
    argv = [
        sys.executable,
        str(ROOT / "main.py"),
        "--model",
        str(tiny_model("llava")),
        "--data-dir",
        str(tmp_path / "data"),
    ]
    with open(log_path, "w") as log:
        app = subprocess.Popen(argv, env=env, cwd=str(tmp_path), stdout=log, stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + 180
        while not {"shown", "ready"} <= (marks := read_trace(trace)).keys():
            assert "failed" not in marks and app.poll() is None, log_path.read_text()
            assert time.monotonic() < end, f"no shown/ready marks after 180 s: {marks}\n{log_path.read_text()}"
            time.sleep(0.05)  # the app writes the file; the deadline above bounds the wait
        (shown_at, heavy_when_shown), (ready_at, heavy_when_ready) = marks["shown"], marks["ready"]
        assert heavy_when_shown == "none", f"imported before the window showed: {heavy_when_shown}"
        assert "torch" in heavy_when_ready.split(",")  # the trace does see torch once the engine loads it
        assert shown_at < ready_at
        app.send_signal(signal.SIGTERM)
        assert app.wait(timeout=60) == 0, log_path.read_text()
        # the app says when all is saved; it then ends without the interpreter's teardown
        # (tests/bench/startup.py times SIGTERM -> saved -> process gone)
        assert "saved" in read_trace(trace), log_path.read_text()
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()


def test_the_window_says_loading_at_once_while_the_engine_is_still_starting(qtbot, tmp_path, tiny_model):
    # at launch the window is up before the engine thread has imported torch: a queued load must
    # read "Loading …" from the first frame, never "No model is loaded" with a "Get a model" button
    from PySide6.QtWidgets import QPushButton

    import app  # noqa: F401  (the PySide6 refcount workaround before any signal)
    from app.connection.bridge import EngineBridge
    from app.history.history import History
    from app.shell.main_window import MainWindow
    from tests.helpers.window import TIMEOUT_MS, make_prefs

    data = tmp_path / "data"
    prefs = make_prefs(tmp_path / "prefs.ini")
    bridge = EngineBridge.create(prefs.engine_settings(), data, start=False)
    w = MainWindow(bridge, History(data), prefs, data)
    qtbot.addWidget(w)
    w.show()
    try:
        model = tiny_model("llava")
        w.load_model(str(model))
        qtbot.waitUntil(lambda: w.status.model_label.text() == f"Loading {model.name}…", timeout=TIMEOUT_MS)
        assert not w.model_ready and w.composer.send.toolTip() == "The model is loading"
        get_a_model = w.findChild(QPushButton, "emptyChatModels")
        assert get_a_model is None or not get_a_model.isVisible()
        bridge.start()
        qtbot.waitUntil(lambda: w.model_ready, timeout=TIMEOUT_MS)
    finally:
        w.shutdown()
