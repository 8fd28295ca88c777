"""The OpenAI-compatible API server run inside the app: turned on and off from Settings, on the
window's own engine; its activity in the memory dock; refusals and bind failures said clearly."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QDialogButtonBox

from app.connection.bridge import EngineBridge
from app.history.history import History
from app.settings.settings_dialog import SettingsDialog
from app.shell.main_window import MainWindow
from tests.helpers.window import OPENER, free_port, make_prefs, ok, post, send, settings, wait_reply


def get(url: str) -> dict:
    with OPENER.open(url, timeout=30) as r:
        return json.loads(r.read())


def refused(url: str) -> bool:
    try:
        OPENER.open(url, timeout=5).close()
    except urllib.error.URLError as exc:
        return isinstance(exc.reason, ConnectionRefusedError)
    return False


def test_settings_start_and_stop_the_server_and_the_dock_follows(make_window, qtbot):
    w = make_window(max_new_tokens=4)
    assert w.api.state == "off" and w.api.server is None  # off by default
    assert w.memory_dock.api_rows.labels["api_state"].text() == "off" and not w.status.api_label.isVisible()
    port = free_port()
    assert ok(qtbot, w, settings(qtbot, w, True, port=port))
    url = f"http://127.0.0.1:{port}/v1"
    assert (w.api.state, w.api.url) == ("listening", url)
    assert w.prefs.api_config().enabled and w.prefs.api_config().port == port  # persisted
    qtbot.waitUntil(lambda: w.memory_dock.api_rows.labels["api_state"].text() == f"listening on {url}", timeout=5000)
    assert w.status.api_label.isVisible() and f"127.0.0.1:{port}" in w.status.api_label.text()

    models = get(f"{url}/models")
    assert [m["id"] for m in models["data"]] == [w.bridge.engine.loaded.name]
    reply = post(
        f"{url}/chat/completions",
        {"model": models["data"][0]["id"], "max_tokens": 3, "messages": [{"role": "user", "content": "hello"}]},
    )
    assert reply["object"] == "chat.completion" and reply["usage"]["completion_tokens"] >= 1

    # the dock: request count and last client (queued from the HTTP thread)
    rows = w.memory_dock.api_rows.labels
    qtbot.waitUntil(
        lambda: "api_requests" in rows and rows["api_requests"].text() == "1" and rows["api_active"].text() == "0",
        timeout=5000,
    )
    assert rows["api_errors"].text() == "0"
    assert rows["api_last_client"].text().startswith("127.0.0.1 at ") and "s ago" in rows["api_last_client"].text()
    # the API's session is labelled as an API conversation in the per-conversation KV
    with qtbot.waitSignal(w.bridge.memoryReport, timeout=30000) as blocker:
        w.bridge.request_memory_report()
    assert "api:1" in blocker.args[0].sessions_kv
    w.memory_dock.refresh_now()
    assert "API conversation 1: " in w.memory_dock.kv.text()
    assert "Hot KV, API conversation 1" in w.memory_dock.bar.toolTip()

    # the same settings again leave the server alone; a new port restarts it there
    server = w.api.server
    assert ok(qtbot, w, settings(qtbot, w, True, port=port)) and w.api.server is server
    port2 = free_port()
    assert ok(qtbot, w, settings(qtbot, w, True, port=port2))
    assert w.api.url == f"http://127.0.0.1:{port2}/v1" and refused(f"{url}/models")
    assert get(f"http://127.0.0.1:{port2}/v1/models")["data"]

    # disabling stops it
    assert ok(qtbot, w, settings(qtbot, w, False, port=port2))
    assert w.api.state == "off" and refused(f"http://127.0.0.1:{port2}/v1/models")
    assert not w.prefs.api_config().enabled
    qtbot.waitUntil(lambda: rows["api_state"].text() == "off", timeout=5000)
    assert not w.status.api_label.isVisible()


def test_non_loopback_without_token_is_refused_in_the_dialog(make_window, qtbot):
    w = make_window(max_new_tokens=4)
    seen = {}

    def fill_and_press_ok():
        dlg = next((x for x in QApplication.topLevelWidgets() if isinstance(x, SettingsDialog) and x.isVisible()), None)
        if dlg is None:
            return QTimer.singleShot(20, fill_and_press_ok)
        dlg.api_enabled.setChecked(True)
        dlg.api_host.setText("0.0.0.0")
        dlg.api_token.setText("")
        dlg.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok).click()
        seen["open"] = dlg.isVisible()
        seen["error"] = dlg.api_error.text() if dlg.api_error.isVisible() else ""
        dlg.reject()

    QTimer.singleShot(0, fill_and_press_ok)
    w.open_settings()  # modal, as from the menu
    assert seen["open"] is True  # OK did not close it
    assert "token is required" in seen["error"] and "0.0.0.0" in seen["error"]
    assert w.api.server is None and not w.prefs.api_config().enabled  # nothing saved, nothing started

    # the same setting reaching the window another way (e.g. saved earlier) is refused in the status bar
    dlg = settings(qtbot, w, True, host="0.0.0.0")
    w.prefs.set_api_config(dlg.api_config())
    assert w.apply_api(w.prefs.api_config()) is not None
    assert w.api.state == "failed" and "token is required" in w.statusBar().currentMessage()
    qtbot.waitUntil(
        lambda: w.memory_dock.api_rows.labels["api_state"].text().startswith("not running — An API token"), timeout=5000
    )
    assert "not running" in w.status.api_label.text()
    # with a token it is accepted by the dialog's check (no bind here: a test must not open the network)
    from app.settings.preferences import config_problem

    assert config_problem(settings(qtbot, w, True, host="0.0.0.0", token="s3cret").api_config()) is None

    # and the app keeps working
    send(qtbot, w, "still there?")
    wait_reply(qtbot, w)
    assert w.messages.items()[-1].role == "assistant" and w.messages.items()[-1].text


def test_a_busy_port_is_said_and_the_running_server_stays(make_window, qtbot):
    w = make_window(load=False)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        port = busy.getsockname()[1]
        dlg = settings(qtbot, w, True, port=port)
        assert not ok(qtbot, w, dlg)  # the dialog stays open
        assert dlg.api_error.isVisibleTo(dlg) and f"Cannot listen on 127.0.0.1:{port}" in dlg.api_error.text()
        assert w.api.state == "failed" and f"127.0.0.1:{port}" in w.statusBar().currentMessage()
        qtbot.waitUntil(
            lambda: "not running — Cannot listen" in w.memory_dock.api_rows.labels["api_state"].text(), timeout=5000
        )
        # a running server moved to a busy port stays where it was, and says so
        good = free_port()
        assert ok(qtbot, w, settings(qtbot, w, True, port=good))
        dlg = settings(qtbot, w, True, port=port)
        assert not ok(qtbot, w, dlg)
        assert f"stays on http://127.0.0.1:{good}/v1" in dlg.api_error.text()
        assert w.api.url == f"http://127.0.0.1:{good}/v1" and get(f"{w.api.url}/models") == {
            "object": "list",
            "data": [],
        }
    finally:
        busy.close()
    # the window still works: settings apply as usual
    assert ok(qtbot, w, settings(qtbot, w, False))
    assert w.api.state == "off"


def test_server_from_saved_settings_starts_with_the_window_and_stops_before_the_engine(qtbot, tmp_path):
    prefs = make_prefs(tmp_path / "prefs.ini")
    port = free_port()
    from app.settings.preferences import ApiConfig

    prefs.set_api_config(ApiConfig(enabled=True, port=port))
    bridge = EngineBridge.create(prefs.engine_settings(), tmp_path / "data")
    w = MainWindow(bridge, History(tmp_path / "data"), prefs, tmp_path / "data")
    qtbot.addWidget(w)
    try:
        assert w.api.state == "listening"
        assert get(f"http://127.0.0.1:{port}/v1/models") == {"object": "list", "data": []}
        order = []
        stop, shutdown = w.api.stop, bridge.engine.shutdown
        w.api.stop = lambda: (order.append("api"), stop())[1]
        bridge.engine.shutdown = lambda *a: (order.append("engine"), shutdown(*a))[1]
    finally:
        w.shutdown()
    assert order == ["api", "engine"]
    assert refused(f"http://127.0.0.1:{port}/v1/models")


def test_the_api_server_serves_the_built_in_engine_whichever_engine_the_window_uses(qtbot, tmp_path):
    """The API server shares the built-in engine (its caches and model), never a server the window
    talks to: a window made while a remote engine is in use still serves the built-in one (it was
    handed the engine in use, and failed on the remote's missing data folder)."""
    from app.settings.preferences import ApiConfig
    from tests.helpers.remote_servers import remote

    prefs = make_prefs(tmp_path / "prefs.ini")
    port = free_port()
    prefs.set_api_config(ApiConfig(enabled=True, port=port))
    bridge = EngineBridge.create(prefs.engine_settings(), tmp_path / "data")
    far = remote(f"http://127.0.0.1:{free_port()}", model="big-vlm")  # nothing listens there
    bridge.use_engine(far)
    w = MainWindow(bridge, History(tmp_path / "data"), prefs, tmp_path / "data")
    qtbot.addWidget(w)
    try:
        assert w.api.engine is bridge.builtin
        assert get(f"http://127.0.0.1:{port}/v1/models") == {"object": "list", "data": []}  # no model loaded here
    finally:
        w.shutdown()


@pytest.mark.parametrize("stored", [{"api/port": "nonsense"}, {"api/port": 99999}])
def test_bad_stored_api_settings_fall_back(tmp_path, stored):
    prefs = make_prefs(tmp_path / "p.ini")
    for k, v in stored.items():
        prefs.qs.setValue(k, v)
    cfg = prefs.api_config()
    assert (cfg.enabled, cfg.host, cfg.port, cfg.token) == (False, "127.0.0.1", 8011, "")


def test_closing_the_window_mid_request_ends_the_request_and_the_engine(make_window, qtbot):
    import threading
    import time

    w = make_window(max_new_tokens=4)
    port = free_port()
    assert ok(qtbot, w, settings(qtbot, w, True, port=port))
    outcome = {}

    def client():
        try:
            reply = post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                {
                    "model": w.bridge.engine.loaded.name,
                    "max_tokens": 32768,
                    "temperature": 0,
                    "messages": [{"role": "user", "content": "Describe the picture in detail."}],
                },
            )
            outcome["result"] = reply["usage"]["completion_tokens"]  # cut short by the stop
        except Exception as exc:  # or the connection closed under it
            outcome["result"] = type(exc).__name__

    t = threading.Thread(target=client, daemon=True)
    t.start()
    qtbot.waitUntil(
        lambda: (
            w.memory_dock.api_rows.labels.get("api_active") is not None
            and w.memory_dock.api_rows.labels["api_active"].text() == "1"
        ),
        timeout=30000,
    )
    t0 = time.monotonic()
    w.shutdown()
    t.join(15)
    assert not t.is_alive() and outcome["result"] != 32768
    assert time.monotonic() - t0 < 15 and not w.bridge.engine.running
