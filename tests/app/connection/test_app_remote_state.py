"""What the window says about a remote engine follows the last thing that happened (issue 27): a server
that died is not "connected", "none" is not an error, an old speed does not outlive a failed turn,
the built-in engine's "Last turn" holds only its own numbers, and the server's address shows once."""

from __future__ import annotations

import pytest

from tests.helpers.remote_servers import Instant, StubServer
from tests.helpers.window import choose_engine, send, wait_reply

pytest.importorskip("openai")
TIMEOUT_MS = 120_000


def test_server_dock_and_status_bar_follow_the_last_event(make_window, qtbot):
    w = make_window(max_new_tokens=6)
    local = []
    w.bridge.turnDone.connect(local.append)
    send(qtbot, w, "a turn on the built-in engine")
    wait_reply(qtbot, w)
    local_stats = local[-1].stats
    server = StubServer(Instant)
    try:
        choose_engine(w, qtbot, server.root)
        qtbot.waitUntil(lambda: w.model_ready and "(remote)" in w.status.model_label.text(), timeout=TIMEOUT_MS)
        address = server.root.removeprefix("http://")
        bar = [lab.text() for lab in (w.engines.label, w.status.model_label, w.status.device_label) if lab.isVisible()]
        assert sum(text.count(address) for text in bar) == 1, bar  # the address once, in "Remote: …"

        send(qtbot, w, "hello server")
        wait_reply(qtbot, w)
        panel = w.engines.panel
        qtbot.waitUntil(lambda: panel.text("turns") == "1", timeout=TIMEOUT_MS)
        assert panel.text("state") == "connected" and panel.text("error") == "none"
        assert panel.rows["error"].objectName() != "problemLabel"  # "none" is not shown as a problem
        assert w.status.speed_label.text().endswith("tok/s")
    finally:
        server.close()

    send(qtbot, w, "are you still there?")  # the server is gone
    wait_reply(qtbot, w)
    assert "connection refused" in w.notice.text()
    qtbot.waitUntil(lambda: panel.text("state") != "connected", timeout=TIMEOUT_MS)
    assert panel.text("state") == "last request failed"
    assert panel.text("error") == w.notice.text() and panel.rows["error"].objectName() == "problemLabel"
    assert w.status.speed_label.text() == ""  # no speed from a turn that did not run

    choose_engine(w, qtbot, None)  # back on the built-in engine
    qtbot.waitUntil(lambda: w.model_ready and "(remote)" not in w.status.model_label.text(), timeout=TIMEOUT_MS)
    assert w.status.speed_label.text() == ""
    w.memory_dock.refresh_now()
    rows = w.memory_dock.turn_rows.labels
    # "Last turn" is the built-in engine's last turn, every row of it, nothing from the server's
    assert rows["prompt_tokens"].text() == f"{local_stats.prompt_tokens:,}"
    assert rows["generated_tokens"].text() == f"{local_stats.generated_tokens:,}"
    assert rows["prefill_s"].text() == f"{local_stats.prefill_s * 1000:.1f} ms"
    assert rows["first_token_s"].text() == f"{local_stats.first_token_s * 1000:.1f} ms"
