"""`make bench-report`: run the benchmarks and write docs/benchmarks.md from what they printed.

Each benchmark's output goes to docs/bench-runs/NAME.log (and NAME.json where the benchmark takes
--json: the series the charts are drawn from); the machine it ran on goes to
docs/bench-runs/machine.json. The report is then rendered from every log in that folder, so a
benchmark run by hand (same folder, same names) is reported too, `--render` alone redraws the
report without running anything, and docs/bench-runs/notes.md (if any) is included as written.
Figures are the lines the benchmarks print with tests/bench/_common.ratio_line:
"label: value [unit]  (goal ...: yes|no)" or "label: value  (note)".

    python packaging/bench_report.py [--only NAME ...] [--bench-args "--quick"] [--render]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "tests" / "bench"
DOCS = ROOT / "docs"
RUNS = DOCS / "bench-runs"
FIGURE = re.compile(
    r"^(?P<label>(?:(?!  ).){3,160}?): (?P<value>-?\d+(?:\.\d+)?)(?: (?P<unit>[^\s(\[]+))?"
    r"(?:  \((?P<paren>.*?)\))?(?:  \[(?P<note>.*)\])?\s*$"
)
VERDICT = re.compile(r"^goal (?P<goal>.+): (?P<met>yes|no)$")


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    flags: list[str] = []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):  # the vector units these kernels' speed depends on
                flags = [f for f in line.split(":", 1)[1].split() if f.startswith(("avx", "amx", "fma", "f16c"))]
            if cpu and flags:
                break
    except OSError:
        pass
    ram = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = int(line.split()[1]) * 1024
    except OSError:
        pass
    versions = subprocess.run(
        [sys.executable, "-c", "import torch, transformers; print(torch.__version__, transformers.__version__)"],
        capture_output=True,
        text=True,
    ).stdout.split()
    return {
        "cpu": cpu,
        "flags": " ".join(flags) or "not read",
        "cores": os.cpu_count(),
        "ram_bytes": ram,
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": versions[0] if versions else "?",
        "transformers": versions[1] if len(versions) > 1 else "?",
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def run(scripts: list[str], bench_args: list[str], save_as: str | None = None) -> None:
    RUNS.mkdir(parents=True, exist_ok=True)
    (RUNS / "machine.json").write_text(json.dumps(machine(), indent=1))
    for script_name in scripts:
        script = BENCH / f"{script_name}.py"
        name = save_as or script_name  # a second configuration of one benchmark keeps its own log
        cmd = [sys.executable, "-u", str(script), *bench_args]
        if '"--json"' in script.read_text():
            cmd += ["--json", str(RUNS / f"{name}.json")]
        print(f"== {name}", flush=True)
        t0 = time.monotonic()
        with open(RUNS / f"{name}.log", "w") as log:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            assert proc.stdout is not None  # stdout=PIPE
            for line in proc.stdout:
                sys.stdout.write(line)
                log.write(line)
            code = proc.wait()
        meta = {
            "args": bench_args,
            "exit": code,
            "seconds": round(time.monotonic() - t0, 1),
            "finished": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine(),  # machines differ between sessions: each run names its own
        }
        (RUNS / f"{name}.meta.json").write_text(json.dumps(meta, indent=1))
        if code:
            print(f"== {name} failed (exit {code}); the report says so", flush=True)


def figures(log: str) -> list[dict]:
    out = []
    for line in log.splitlines():
        m = FIGURE.match(line.strip())
        if not m:
            continue
        row = {
            "label": m["label"],
            "value": m["value"],
            "unit": m["unit"] or "",
            "goal": "",
            "met": "",
            "note": m["note"] or "",
        }
        verdict = VERDICT.match(m["paren"] or "")
        if verdict:
            row["goal"], row["met"] = verdict["goal"], verdict["met"]
        elif m["paren"]:
            row["note"] = m["paren"]
        out.append(row)
    return out


def charts(rendered: list[str], where: Path) -> list[str]:
    """Draw the PNGs the series allow; returns markdown lines for them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    md = []
    rr = RUNS / "restore_real.json"
    if rr.exists() and "restore_real" in rendered:
        data = json.loads(rr.read_text())
        pts = data["lengths"]
        if pts:
            fig, ax = plt.subplots(figsize=(6, 3.6))
            x = [p["tokens"] for p in pts]
            ax.plot(x, [p["reprefill_s"] for p in pts], "o-", label="re-prefill (TTFT), bf16")
            ax.plot(x, [p["resume_ttft_s"] for p in pts], "s-", label="resume from SSD (TTFT), bf16")
            other = RUNS / "restore_real_fp32.json"  # the float32 run reaches 32K on a CPU
            if other.exists() and "restore_real_fp32" in rendered:
                more = json.loads(other.read_text())["lengths"]
                x2 = [p["tokens"] for p in more]
                ax.plot(x2, [p["reprefill_s"] for p in more], "o--", label="re-prefill (TTFT), float32")
                ax.plot(x2, [p["resume_ttft_s"] for p in more], "s--", label="resume from SSD (TTFT), float32")
            for s in data.get("skipped", []):
                ax.axvline(s["tokens"], color="grey", ls=":", lw=1)
                ax.annotate(
                    f"{s['tokens']}: bf16 not run",
                    (s["tokens"], ax.get_ylim()[1] * 0.5),
                    rotation=90,
                    fontsize=7,
                    color="grey",
                    ha="right",
                )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("conversation length (tokens)")
            ax.set_ylabel("seconds")
            ax.set_title(
                f"Restore vs re-prefill, {data['shape']}{' (quick)' if data['quick'] else ''}, CPU", fontsize=9
            )
            ax.legend(fontsize=8)
            fig.tight_layout()
            fig.savefig(where / "bench-restore-vs-prefill.png", dpi=110)
            plt.close(fig)
            md.append("![restore vs re-prefill against conversation length](bench-restore-vs-prefill.png)")
        spills = data["spills"]
        if spills:
            fig, ax = plt.subplots(figsize=(6, 3.6))
            for kind, marker in (("first spill", "o"), ("incremental", "s")):
                sel = [s for s in spills if s["kind"] == kind]
                if sel:
                    ax.plot([s["new_tokens"] for s in sel], [s["spill_s"] for s in sel], marker, label=kind)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("new tokens written by the spill")
            ax.set_ylabel("spill seconds")
            ax.set_title(f"Spill time against new tokens, {data['shape']}", fontsize=9)
            ax.legend(fontsize=8)
            fig.tight_layout()
            fig.savefig(where / "bench-spill-time.png", dpi=110)
            plt.close(fig)
            md.append("![spill time against new tokens](bench-spill-time.png)")
    ig = RUNS / "image_gate_real.json"
    if ig.exists() and "image_gate_real" in rendered:
        data = json.loads(ig.read_text())
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for key, label, marker in (
            ("gated", "gate on (cached after turn 1)", "o-"),
            ("gate_off", "gate off (encoder every turn)", "s-"),
        ):
            ys = [t["s"] for t in data[key]]
            ax.plot(range(1, len(ys) + 1), ys, marker, label=label)
        text = [t["s"] for t in data["text_only"]]
        if text:
            ax.axhline(sum(text) / len(text), color="grey", ls="--", lw=1, label="text-only turn (mean)")
        locator = ax.xaxis.get_major_locator()
        if isinstance(locator, MaxNLocator):  # the default AutoLocator is one
            locator.set_params(integer=True)
        ax.set_xlabel("picture turn (each a fresh conversation, encoder unloaded before it)")
        ax.set_ylabel("turn seconds")
        ax.set_ylim(bottom=0)
        ax.set_title(f"Per-turn latency with and without the gate, {data['shape']}", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(where / "bench-gate-turns.png", dpi=110)
        plt.close(fig)
        md.append("![per-turn latency with and without the gate](bench-gate-turns.png)")
    dc = RUNS / "day_of_chats.json"
    if dc.exists() and "day_of_chats" in rendered:
        data = json.loads(dc.read_text())
        turns = data["turns"]
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
        x = [t["turn"] for t in turns]
        for side, colour in zip(data["sides"], ("tab:blue", "tab:red", "tab:orange"), strict=False):
            total, first = 0.0, 0.0
            whole, ttft = [], []
            for t in turns:
                total += t[side]["wall_s"]
                first += t[side]["ttft_s"]
                whole.append(total)
                ttft.append(first)
            ax.plot(x, whole, "-", color=colour, label=f"{side}: whole turns")
            ax.plot(x, ttft, "--", color=colour, label=f"{side}: first tokens")
        for t in turns:  # what came before a turn: a restart (solid) or an idle gap (dotted)
            if "restart" in t["before"]:
                ax.axvline(t["turn"] - 0.5, color="grey", lw=1)
            elif "idle" in t["before"]:
                ax.axvline(t["turn"] - 0.5, color="grey", lw=1, ls=":")
        locator = ax.xaxis.get_major_locator()
        if isinstance(locator, MaxNLocator):
            locator.set_params(integer=True)
        ax.set_xlabel("turn of the day (grey: a restart; dotted: an idle gap before it)")
        ax.set_ylabel("cumulative waiting, seconds")
        ax.set_ylim(bottom=0)
        ax.set_title(
            f"A day of picture chats, {data['shape']}{' (quick)' if data['quick'] else ''}, "
            f"{data['new_tokens']}-token replies, CPU",
            fontsize=9,
        )
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(where / "bench-day-of-chats.png", dpi=110)
        plt.close(fig)
        md.append("![cumulative waiting over a day of picture chats](bench-day-of-chats.png)")
    return md


def render(out: Path) -> None:
    logs = sorted(RUNS.glob("*.log"))
    mach = json.loads((RUNS / "machine.json").read_text()) if (RUNS / "machine.json").exists() else machine()
    lines = [
        "# Benchmarks",
        "",
        "Written by `make bench-report` (packaging/bench_report.py) from the runs in "
        "[docs/bench-runs/](bench-runs/): every figure below is a line a benchmark printed. "
        "Benchmarks at published model shapes use random weights of exactly that shape "
        "(tests/fixtures/published_configs.py), so times are real and replies are not.",
        "",
        "## Machine",
        "",
        f"- CPU: {mach['cpu']}, {mach['cores']} cores ({mach.get('flags', 'flags not recorded')}); "
        f"RAM {mach['ram_bytes'] / 2**30:.1f} GiB",
        f"- {mach['os']}; Python {mach['python']}, torch {mach['torch']}, transformers {mach['transformers']}",
        f"- machine read {mach['date']}"
        + (f", load average then {mach['load_average']:.1f}" if mach.get("load_average") else "")
        + "; each run's finishing time and CPU are in the table below (runs before 2026-12-02 16:30 UTC "
        "recorded no flags: the notes name the machine of each)",
        "",
        "## Runs",
        "",
        "| benchmark | mode | status | wall time | finished | CPU |",
        "|---|---|---|---|---|---|",
    ]
    rows, notes, rendered = [], [], []
    for log in logs:
        name = log.stem
        meta_file = RUNS / f"{name}.meta.json"
        meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
        text = log.read_text()
        mode = "quick" if "--quick" in meta.get("args", []) else "full"
        status = (
            "no run record (running, or interrupted)"
            if not meta
            else "ok"
            if meta["exit"] == 0
            else f"failed (exit {meta['exit']})"
        )
        ran_on = meta.get("machine", {})
        cpu = f"{ran_on['cpu']}, {ran_on['cores']} cores: {ran_on['flags']}" if ran_on else "not recorded"
        lines.append(
            f"| {name} | {mode} | {status} | {meta.get('seconds', '?')} s | {meta.get('finished', '?')} | {cpu} |"
        )
        rendered.append(name)
        for f in figures(text):
            rows.append((name, f))
        notes += [
            f"- {name}: {ln.strip().removeprefix('NOT RUN: ')}" for ln in text.splitlines() if ln.startswith("NOT RUN:")
        ]
    lines += ["", "## Figures", "", "| benchmark | figure | value | goal | met | note |", "|---|---|---|---|---|---|"]
    for name, f in rows:
        note = f["note"].replace("|", "/")
        lines.append(
            f"| {name} | {f['label']} | {f['value']}{' ' + f['unit'] if f['unit'] else ''} | "
            f"{f['goal']} | {f['met']} | {note} |"
        )
    if notes:
        lines += ["", "## Not run", "", *notes]
    if (RUNS / "notes.md").exists():  # what the person who ran them observed: kept with the runs
        lines += ["", "## Notes on these runs", "", (RUNS / "notes.md").read_text().strip()]
    pictures = charts(rendered, out.parent)
    if pictures:
        lines += ["", "## Charts", ""] + [p + "\n" for p in pictures]
    out.write_text("\n".join(lines).rstrip() + "\n")
    print(f"wrote {out} ({len(rows)} figures from {len(logs)} benchmarks)")


def main() -> None:
    global RUNS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", default=None, help="benchmark names (default: all in tests/bench)")
    ap.add_argument("--bench-args", default="", help='passed to every benchmark, e.g. "--quick"')
    ap.add_argument("--render", action="store_true", help="only redraw docs/benchmarks.md from docs/bench-runs")
    ap.add_argument("--out", default=str(DOCS / "benchmarks.md"))
    ap.add_argument("--runs", default=str(RUNS), help="where the logs, series and machine.json go")
    ap.add_argument(
        "--save-as",
        default=None,
        help="with one --only: keep this run under another name (e.g. restore_real_fp32), "
        "beside the benchmark's default run",
    )
    args = ap.parse_args()
    RUNS = Path(args.runs).resolve()
    if not args.render:
        names = args.only or sorted(p.stem for p in BENCH.glob("[!_]*.py"))
        unknown = [n for n in names if not (BENCH / f"{n}.py").exists()]
        if unknown:
            sys.exit(f"no such benchmark: {', '.join(unknown)} (see tests/bench/)")
        if args.save_as and len(names) != 1:
            sys.exit("--save-as names the run of one benchmark: give exactly one --only")
        run(names, shlex.split(args.bench_args), args.save_as)
    render(Path(args.out))


if __name__ == "__main__":
    main()
