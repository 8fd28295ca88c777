"""app.worker: work runs off the UI thread, and what it returns, raises or reports comes back on it.

The slow parts are held by Events the tests release, never by sleeps."""

from __future__ import annotations

import threading

from PySide6.QtCore import QTimer

from app.worker import Worker


def test_result_comes_back_on_the_ui_thread_while_the_ui_keeps_running(qtbot):
    worker = Worker("test")
    release = threading.Event()
    ran_on, got = [], []

    def slow(_job):
        ran_on.append(threading.current_thread())
        release.wait(30)
        return 42

    worker.submit(slow, on_done=lambda r: got.append((r, threading.current_thread())))
    ticks = []
    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(1))
    timer.start(0)
    qtbot.waitUntil(lambda: len(ticks) >= 3)  # the UI thread runs its timers while the job is held
    assert got == []
    release.set()
    qtbot.waitUntil(lambda: got != [])
    timer.stop()
    assert got == [(42, threading.main_thread())] and ran_on[0] is not threading.main_thread()
    assert worker.wait_idle()


def test_an_exception_reaches_on_error_and_reports_come_first_in_order(qtbot):
    worker = Worker("test")
    seen = []

    def failing(job):
        for i in range(5):
            job.report(i)
        raise ValueError("no such server")

    worker.submit(failing, on_done=seen.append, on_error=lambda e: seen.append(repr(e)), on_report=seen.append)
    qtbot.waitUntil(lambda: len(seen) == 6)
    assert seen == [0, 1, 2, 3, 4, "ValueError('no such server')"]


def test_a_cancelled_job_delivers_nothing_and_a_queued_one_never_runs(qtbot):
    worker = Worker("test", threads=1)
    release = threading.Event()
    started, got = [], []
    first = worker.submit(lambda _j: release.wait(30) and "first", on_done=got.append)
    second = worker.submit(lambda _j: started.append("second"), on_done=got.append)
    worker.submit(lambda _j: "third", on_done=got.append)
    first.cancel()
    second.cancel()
    release.set()
    qtbot.waitUntil(lambda: got != [])
    assert worker.wait_idle()
    assert got == ["third"] and started == []


def test_a_deleted_worker_delivers_nothing(qtbot):
    from PySide6.QtWidgets import QWidget

    page = QWidget()
    worker = Worker("test", parent=page)
    release = threading.Event()
    got = []
    worker.submit(lambda _j: release.wait(30), on_done=got.append)
    worker.submit(lambda _j: got.append("queued ran"))
    page.deleteLater()
    qtbot.waitUntil(lambda: worker._gone.is_set())
    release.set()
    assert worker.wait_idle()
    qtbot.wait(0)  # let anything that was posted reach the (gone) receiver
    assert got == []


def test_wake_posts_from_other_threads_become_one_call_on_the_ui_thread(qtbot):
    from PySide6.QtCore import QCoreApplication

    from app.worker import Wake

    calls = []

    def on_wake():
        calls.append(threading.current_thread())
        if len(calls) == 1:
            wake.post()  # news that arrives while the callback runs brings one more call

    wake = Wake(on_wake)
    posters = [threading.Thread(target=lambda: [wake.post() for _ in range(200)]) for _ in range(3)]
    for t in posters:
        t.start()
    for t in posters:
        t.join()
    qtbot.waitUntil(lambda: len(calls) == 2)
    QCoreApplication.processEvents()  # nothing else was pending
    assert calls == [threading.main_thread()] * 2
