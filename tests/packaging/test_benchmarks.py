"""Every benchmark in tests/bench/ runs to the end in its --quick mode and prints its goal line.

The benchmarks are found by glob, so a new one is covered without touching this file. Only that
a benchmark completes and reports is checked, never whether its goal was met: quick sizes on a
shared machine say nothing about speed (`make bench` runs the full sizes).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from tests.helpers.side_by_side import ChildRun, SideBySide

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"
BENCHMARKS = sorted(p for p in BENCH_DIR.glob("*.py") if not p.name.startswith("_"))  # _common.py: helpers
# what tests/bench/_common.ratio_line writes for a goal: "label: 0.009  (goal ≤ 0.05: yes)"
GOAL_LINE = re.compile(r"^.+: -?\d+(\.\d+)?( \S+)?  \(goal .+: (yes|no)\)", re.MULTILINE)


def _ratio_line():
    sys.path.insert(0, str(BENCH_DIR))
    try:
        from _common import ratio_line
    finally:
        sys.path.remove(str(BENCH_DIR))
    return ratio_line


def test_goal_line_verdicts():
    ratio_line = _ratio_line()
    assert ratio_line("restore / re-prefill", 0.0091, at_most=0.05) == "restore / re-prefill: 0.009  (goal ≤ 0.05: yes)"
    assert ratio_line("engine / generate", 0.9, at_least=0.95).endswith("(goal ≥ 0.95: no)")
    # a second condition the goal needs: the ratio alone is not enough
    line = ratio_line("cached / text-only", 1.0, at_most=1.05, also=("0 encoder loads", False))
    assert line.endswith("(goal ≤ 1.05 and 0 encoder loads: no)")
    assert ratio_line("stall", 12.34, at_most=50, unit="ms", digits=1) == "stall: 12.3 ms  (goal ≤ 50 ms: yes)"
    # a figure for comparison has no verdict, so it is never taken for a goal line
    shown = ratio_line("gate off / text-only", 3.3, note="for comparison")
    assert not GOAL_LINE.search(shown) and GOAL_LINE.search(line)


def test_benchmarks_are_found():
    assert len(BENCHMARKS) >= 8, [p.name for p in BENCHMARKS]


# what a benchmark prints, alone, when a tool it compares with cannot be had here (no compiler, no PyPI)
SKIPPED = re.compile(r"^skipped: .+$", re.MULTILINE)


@pytest.fixture(scope="module")
def quick_runs(request, tmp_path_factory):
    """The collected benchmarks' quick runs, two at a time in collection order (pytest's own order
    for this module): the tests wait on them one by one. Under pytest-xdist this module must stay
    on one worker (`make test`'s `--dist loadfile`): each worker would start every quick run."""
    if getattr(request.config.option, "dist", "no") not in ("no", "loadfile"):
        pytest.fail("run the benchmarks' quick runs with --dist loadfile: each worker would start all of them")
    scripts = [item.callspec.params["script"] for item in request.session.items if item.originalname == _QUICK]
    runs = []
    # the published shapes' model folders, built once for all the runs: six of them build the
    # Qwen2-VL-2B quick shapes (two of them), about 9 s a build on one core of a 2-core AMD EPYC (AVX2 only)
    shapes = tmp_path_factory.mktemp("shapes")
    for script in scripts:
        tmp = tmp_path_factory.mktemp(script.stem)
        # the benchmark's other scratch folders (stores, data) go under its own TMPDIR, which pytest
        # cleans up; PARLEY_BENCH_NO_BUILD: vs_llamacpp uses a llama.cpp `make bench-tools` built
        # (.ci/run does), and skips with that line where none is built: a 20-minute compile has no
        # place in the suite
        env = dict(
            os.environ,
            TMPDIR=str(tmp),
            PARLEY_SHAPES_DIR=str(shapes),
            QT_QPA_PLATFORM="offscreen",
            TOKENIZERS_PARALLELISM="false",
            HF_HUB_OFFLINE="1",
            PARLEY_BENCH_NO_BUILD="1",
        )
        runs.append(ChildRun(script.stem, [sys.executable, str(script), "--quick"], BENCH_DIR.parent.parent, env))
    pool = SideBySide(runs, tmp_path_factory.mktemp("bench-output"), width=2, timeout_s=600)
    yield pool
    pool.close()


_QUICK = "test_benchmark_quick_mode_completes_with_a_goal_line"


@pytest.mark.slow
@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.stem)
def test_benchmark_quick_mode_completes_with_a_goal_line(script, quick_runs):
    run = quick_runs.result(script.stem)
    tail = f"stdout:\n{run.stdout[-3000:]}\nstderr:\n{run.stderr[-3000:]}"
    assert run.returncode == 0, tail
    skipped = SKIPPED.search(run.stdout)
    if skipped and run.stdout.strip() == skipped.group(0):
        pytest.skip(skipped.group(0))
    assert GOAL_LINE.search(run.stdout), f"no goal line with a yes/no verdict\n{tail}"
