"""The benchmark report reads back every figure line the benchmarks print (ratio_line), and
nothing else, so docs/benchmarks.md cannot silently drop or invent a figure."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _report():
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "packaging" / "bench_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_figures_are_read_from_ratio_lines():
    log = "\n".join(
        [
            "shape Qwen2.5-VL-3B-Instruct: 36 layers, 2 KV heads x 128, bf16 on CPU",  # prose: not a figure
            "TTFT resume / TTFT re-prefill at 8189 tokens: 0.0299  (goal ≤ 0.05: yes)",
            "spill throughput at 8189 tokens: 261 MiB/s  (288 MiB of KV)",
            "new picture: encoder load: 0.04 s",
            "stall: 65.2 ms  (goal ≤ 50 ms: no)  [p99 14 ms]",
            "spill time / its goal (1.2·k/N·full + 20 ms), worst k: 0.904  (goal ≤ 1 and blocks ≤ ceil(k/256) + 1: yes)",  # noqa: E501  (a benchmark's line as printed)
            "model.generate decode: 25.2 tok/s   engine decode: 22.1 tok/s",  # two figures in prose: skipped
        ]
    )
    rows = _report().figures(log)
    got = [(r["label"], r["value"], r["unit"], r["goal"], r["met"], r["note"]) for r in rows]
    assert got == [
        ("TTFT resume / TTFT re-prefill at 8189 tokens", "0.0299", "", "≤ 0.05", "yes", ""),
        ("spill throughput at 8189 tokens", "261", "MiB/s", "", "", "288 MiB of KV"),
        ("new picture: encoder load", "0.04", "s", "", "", ""),
        ("stall", "65.2", "ms", "≤ 50 ms", "no", "p99 14 ms"),
        (
            "spill time / its goal (1.2·k/N·full + 20 ms), worst k",
            "0.904",
            "",
            "≤ 1 and blocks ≤ ceil(k/256) + 1",
            "yes",
            "",
        ),
    ]


def test_a_second_configuration_needs_exactly_one_benchmark(tmp_path):
    # --save-as keeps e.g. restore_real at float32 beside its bf16 run; for two benchmarks it
    # would write both logs under one name, so it is refused before anything runs
    import subprocess
    import sys

    script = ROOT / "packaging" / "bench_report.py"
    done = subprocess.run(
        [
            sys.executable,
            str(script),
            "--only",
            "startup",
            "ui_stall",
            "--save-as",
            "x",
            "--runs",
            str(tmp_path),
            "--out",
            str(tmp_path / "report.md"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "exactly one --only" in done.stderr
    assert not list(tmp_path.iterdir())  # nothing ran, nothing written
