"""How fast the window starts: launch `main.py` (offscreen, a fresh data folder and settings, the
built-in demo model) and time launch → window shown (goal ≤ 1.0 s, with torch not yet imported
when it shows) and launch → model ready (for comparison), median of `--runs` launches; then how
fast it quits: SIGTERM (a logout, or Quit) → everything saved (the app's `saved` mark) → the
process gone (goal ≤ 1.0 s; the interpreter's own teardown of torch and transformers took 2-3 s
of it before the app skipped it).

The app reports its milestones itself: $PARLEY_STARTUP_TRACE (app/shell/startup_trace.py) gets a
`shown` line once the window is up and the event loop runs, and a `ready` line when the model
has loaded, each with the wall-clock time and the heavy modules imported by then. "Launch" is
the moment before the process is spawned, so interpreter start and every import count.
`--quick`: one launch with a tiny random model.

With a built bundle (`make bundle`: dist/Parley/parley, or `--bundle PATH`) the same launches run
the bundle too, and a bundle row compares: window shown (goal ≤ 2 s) and model ready (goal ≤ 1.5×
the checkout's). `--quick` leaves the bundle out (a build may or may not be there).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import ROOT, parse_args, ratio_line, workdir

from app.shell.startup_trace import TRACE_ENV, read_trace
from engine.platform.paths import DEMO_MODEL

DEADLINE_S = 180.0


def isolated_env(home: Path, trace: Path) -> dict:
    """Settings, caches and the single-instance socket in `home`: a first launch, alone."""
    runtime = home / "run"
    runtime.mkdir(parents=True, mode=0o700)
    return {
        **os.environ,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_DATA_HOME": str(home / "share"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "XDG_RUNTIME_DIR": str(runtime),
        "QT_QPA_PLATFORM": "offscreen",
        TRACE_ENV: str(trace),
        "HF_HUB_OFFLINE": "1",
    }


BUNDLE = ROOT / "dist" / "Parley" / "parley"


def launch_once(model: Path, d: Path, program: list[str] | None = None) -> dict[str, tuple[float, str]]:
    """Start the app, wait (up to DEADLINE_S) for its `shown` and `ready` marks, close it as a
    logout would (SIGTERM) and return the marks with times relative to the launch, and the
    moments SIGTERM was sent (`quit`) and the process was gone (`gone`)."""
    trace, log_path = d / "trace", d / "app.log"
    env = isolated_env(d / "home", trace)
    program = program or [sys.executable, str(ROOT / "main.py")]  # the checkout; or the bundle's executable
    argv = [*program, "--data-dir", str(d / "data"), "--model", str(model)]
    with open(log_path, "w") as log:
        launched = time.time()
        proc = subprocess.Popen(argv, env=env, cwd=str(d), stdout=log, stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + DEADLINE_S
        while not {"shown", "ready"} <= (marks := read_trace(trace)).keys():
            if "failed" in marks or proc.poll() is not None or time.monotonic() > end:
                raise SystemExit(
                    f"the app did not reach ready (exit {proc.poll()}, marks {sorted(marks)}):\n"
                    + log_path.read_text()[-3000:]
                )
            time.sleep(0.02)  # polling a file another process writes; the deadline above bounds it
        quit_at = time.time()
        proc.send_signal(signal.SIGTERM)
        if proc.wait(timeout=60) != 0:
            raise SystemExit(f"the app exited with {proc.returncode} on SIGTERM:\n" + log_path.read_text()[-3000:])
        gone_at = time.time()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    marks = read_trace(trace)
    if "saved" not in marks:
        raise SystemExit("the app ended without its `saved` mark:\n" + log_path.read_text()[-3000:])
    marks.update(quit=(quit_at, ""), gone=(gone_at, ""))
    return {event: (t - launched, heavy) for event, (t, heavy) in marks.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="launches; the median is reported")
    parser.add_argument("--model", default=str(DEMO_MODEL), help="model folder to load")
    parser.add_argument(
        "--bundle", default=str(BUNDLE), help="a built bundle's executable to compare (default: dist/Parley/parley)"
    )
    args = parse_args(parser, quick={"runs": 1, "model": None, "bundle": ""})
    d = workdir("startup")
    if args.model is None:
        from tests.fixtures.tiny_models import build_tiny_model

        args.model = str(build_tiny_model("llava", d / "tiny"))
    shown, ready, heavy_at_shown, saving, gone = [], [], set(), [], []
    for run in range(args.runs):
        marks = launch_once(Path(args.model), d / f"run{run}")
        shown.append(marks["shown"][0])
        ready.append(marks["ready"][0])
        heavy_at_shown.add(marks["shown"][1])
        saving.append(marks["saved"][0] - marks["quit"][0])
        gone.append(marks["gone"][0] - marks["quit"][0])
        print(
            f"launch {run + 1}: window shown {shown[-1]:.2f} s (heavy modules then: {marks['shown'][1]}), "
            f"model ready {ready[-1]:.2f} s; quit: saved after {saving[-1]:.2f} s, gone after {gone[-1]:.2f} s",
            flush=True,
        )
    torch_free = heavy_at_shown == {"none"}
    print(
        ratio_line(
            f"launch → window shown, median of {args.runs}",
            statistics.median(shown),
            at_most=1.0,
            unit="s",
            digits=2,
            also=("torch not imported yet", torch_free),
        )
    )
    print(
        ratio_line(
            f"launch → model ready, median of {args.runs}",
            statistics.median(ready),
            unit="s",
            digits=2,
            note=f"{Path(args.model).name}",
        )
    )
    print(
        ratio_line(
            f"SIGTERM → everything saved, median of {args.runs}",
            statistics.median(saving),
            unit="s",
            digits=2,
            note="engine stopped, history and settings closed",
        )
    )
    print(
        ratio_line(
            f"SIGTERM → process gone, median of {args.runs}", statistics.median(gone), at_most=1.0, unit="s", digits=2
        )
    )

    if args.bundle and Path(args.bundle).is_file():
        bundle_row(Path(args.bundle), Path(args.model), args.runs, d, statistics.median(ready))
    elif args.bundle:
        print(f"bundle: not measured ({args.bundle} is not built: make bundle)")


def bundle_row(exe: Path, model: Path, runs: int, d: Path, checkout_ready: float) -> None:
    shown, ready = [], []
    for run in range(runs):
        marks = launch_once(model, d / f"bundle{run}", [str(exe)])
        shown.append(marks["shown"][0])
        ready.append(marks["ready"][0])
        print(f"bundle launch {run + 1}: window shown {shown[-1]:.2f} s, model ready {ready[-1]:.2f} s", flush=True)
    print(
        ratio_line(
            f"bundle: launch → window shown, median of {runs}",
            statistics.median(shown),
            at_most=2.0,
            unit="s",
            digits=2,
        )
    )
    print(
        ratio_line(
            f"bundle: model ready / the checkout's, median of {runs}",
            statistics.median(ready) / checkout_ready,
            at_most=1.5,
            unit="×",
            digits=2,
            note=f"{statistics.median(ready):.2f} s vs {checkout_ready:.2f} s",
        )
    )


if __name__ == "__main__":
    main()
