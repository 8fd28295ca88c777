"""Child processes run two at a time, for tests that each wait on one (the benchmarks' quick runs).

A test asks for its own process's result; that starts it and the next one queued, so while a test
waits the next child is already running. Each child gets one thread for torch and numba (two
children on two cores: neither waits for a core, and a quick run checks completion, not speed).
Output goes to files, not pipes, so a chatty child never blocks on a full pipe.

Called from the pytest thread only.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ChildRun:
    """One child's command line, folder and environment."""

    key: str
    argv: list[str]
    cwd: Path
    env: dict[str, str]


@dataclass(frozen=True)
class Finished:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


class _Running:
    def __init__(self, run: ChildRun, out_dir: Path):
        self.run = run
        self.out = out_dir / f"{run.key}.out"
        self.err = out_dir / f"{run.key}.err"
        env = dict(run.env, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
        self.started = time.monotonic()
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(run.argv, cwd=run.cwd, env=env, stdout=out, stderr=err)

    def wait(self, timeout_s: float) -> Finished:
        try:
            code = self.proc.wait(timeout=max(1.0, self.started + timeout_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
            raise subprocess.TimeoutExpired(self.run.argv, timeout_s, output=self.out.read_bytes()) from None
        text = lambda p: p.read_bytes().decode("utf-8", "replace")  # noqa: E731
        return Finished(code, text(self.out), text(self.err), time.monotonic() - self.started)


class SideBySide:
    """Runs `queue` (in order) `width` children at a time; `result(key)` waits for one."""

    def __init__(self, queue: list[ChildRun], out_dir: Path, width: int = 2, timeout_s: float = 600):
        self._queue = list(queue)
        self._index = {r.key: i for i, r in enumerate(self._queue)}
        self._running: dict[str, _Running] = {}
        self._out_dir = out_dir
        self._width = width
        self._timeout_s = timeout_s

    def result(self, key: str) -> Finished:
        at = self._index[key]
        for run in self._queue[at : at + self._width]:
            if run.key not in self._running:
                self._running[run.key] = _Running(run, self._out_dir)
        return self._running[key].wait(self._timeout_s)

    def close(self) -> None:
        """Stop children started but never waited for (a test run cut short)."""
        for r in self._running.values():
            if r.proc.poll() is None:
                r.proc.kill()
                r.proc.wait()
