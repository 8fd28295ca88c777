"""Settings ▸ Engine asks a server for its models off the UI thread (issue 40: the call froze the
window for up to 15 s). The slow server is held by an Event the test releases, never by a clock."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QCoreApplication, QTimer

from app.settings.engine_box import EngineBox
from app.settings.engine_choice import EngineChoice
from tests.helpers.remote_servers import Instant, SlowModels, StubServer, free_port


@pytest.fixture
def slow():
    server = StubServer(SlowModels)
    yield server
    server.close()


@pytest.fixture
def box(qtbot):
    b = EngineBox(EngineChoice())
    qtbot.addWidget(b)
    b.show()
    b.add_server()
    yield b
    assert b.checks.wait_idle()


def test_a_slow_server_leaves_the_box_responsive_and_says_checking(qtbot, box, slow):
    qtbot.keyClicks(box.url, slow.root)
    box.fetch.click()
    ticks = []
    timer = QTimer(box)
    timer.timeout.connect(lambda: ticks.append(1))
    timer.start(0)
    # the server holds the answer: the UI thread meanwhile runs its timers and takes typing
    qtbot.waitUntil(lambda: slow.httpd.asked.is_set() and len(ticks) >= 3)
    assert box.checking.isVisible() and box.checking.text().startswith("Checking")
    box.model.setEditText("typed while checking")
    assert box.model.currentText() == "typed while checking" and box.fetch.isEnabled()
    with qtbot.waitSignal(box.checked) as got:
        slow.httpd.release.set()
    timer.stop()
    assert got.args == [["slow-vlm"]]
    assert not box.checking.isVisible() and box.error.isHidden()
    assert [box.model.itemText(i) for i in range(box.model.count())] == ["slow-vlm"]


def test_a_second_check_supersedes_the_first(qtbot, box, slow):
    answers = []
    box.checked.connect(answers.append)
    qtbot.keyClicks(box.url, slow.root)
    box.fetch.click()
    qtbot.waitUntil(slow.httpd.asked.is_set)
    box.fetch.click()  # the same server again: only this check's answer counts
    slow.httpd.release.set()
    qtbot.waitUntil(lambda: answers != [])
    assert box.checks.wait_idle()
    QCoreApplication.processEvents()  # anything the first check posted arrives now, if ever
    assert answers == [["slow-vlm"]]


def test_an_edited_address_drops_the_answer_of_the_one_before(qtbot, box, slow):
    fast = StubServer(Instant)
    try:
        answers = []
        box.checked.connect(answers.append)
        qtbot.keyClicks(box.url, slow.root)
        box.fetch.click()
        qtbot.waitUntil(slow.httpd.asked.is_set)
        box.url.clear()
        qtbot.keyClicks(box.url, fast.root)  # typing drops the slow server's check
        assert not box.checking.isVisible()
        with qtbot.waitSignal(box.checked):
            box.fetch.click()
        slow.httpd.release.set()
        assert box.checks.wait_idle()
        QCoreApplication.processEvents()
        assert answers == [["big-vlm"]] and box.model.currentText() == "big-vlm"
    finally:
        fast.close()


def test_a_refused_connection_is_said_in_the_box(qtbot, box):
    qtbot.keyClicks(box.url, f"127.0.0.1:{free_port()}")
    with qtbot.waitSignal(box.checked, timeout=30_000) as got:
        box.fetch.click()
    assert got.args == [[]]
    assert "connection refused" in box.error.text() and not box.error.isHidden() and not box.checking.isVisible()
