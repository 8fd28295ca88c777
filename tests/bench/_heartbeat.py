"""The UI thread's heartbeat for the window benchmarks (ui_stall, hostile_inputs): a 5 ms timer on
the UI thread, the gaps between its ticks and the CPU time spent in each."""

from __future__ import annotations

import time

from PySide6.QtCore import QEventLoop, QTimer

HEARTBEAT_MS = 5


class Heartbeat:
    """Gaps (wall ms) between ticks of a 5 ms timer on the UI thread, with the UI thread's own CPU
    time in each and the whole process's: a long gap with little UI-thread CPU
    is the UI thread waiting; for the GIL when the process's other threads ran meanwhile, for a
    core when nothing here did."""

    def __init__(self):
        self.gaps: list[float] = []
        self.cpu: list[float] = []
        self.process_cpu: list[float] = []
        self._last = self._cpu = self._process_cpu = 0.0
        self.timer = QTimer()
        self.timer.setInterval(HEARTBEAT_MS)
        self.timer.timeout.connect(self._tick)

    def start(self) -> None:
        self.gaps.clear()
        self.cpu.clear()
        self.process_cpu.clear()
        self._last, self._cpu, self._process_cpu = time.perf_counter(), time.thread_time(), time.process_time()
        self.timer.start()

    def stop(self) -> None:
        self.timer.stop()

    def _tick(self) -> None:
        now, cpu, process_cpu = time.perf_counter(), time.thread_time(), time.process_time()
        self.gaps.append((now - self._last) * 1000)
        self.cpu.append((cpu - self._cpu) * 1000)
        self.process_cpu.append((process_cpu - self._process_cpu) * 1000)
        self._last, self._cpu, self._process_cpu = now, cpu, process_cpu


def run_until(done, timeout_s: float = 120.0) -> None:
    """Run the UI thread's event loop until `done()` or `timeout_s`."""
    loop = QEventLoop()
    check = QTimer()
    check.timeout.connect(lambda: loop.quit() if done() else None)
    check.start(20)
    QTimer.singleShot(int(timeout_s * 1000), loop.quit)
    loop.exec()
    check.stop()
