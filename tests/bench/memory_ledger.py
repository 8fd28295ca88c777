"""How well the memory dock's total matches what the process really holds, at the published
SmolVLM-256M shape (bf16 on CPU).

The dock's total is the sum of the MemoryReport components that live in this process's memory on
the CPU device: language model + vision encoder + tokenizer and processor and numba's compiled
kernels (each measured by the loader around its load) + hot KV + image cache (RAM). The measured figure
is the growth of the process's resident anonymous memory (RssAnon in /proc/self/status: what it
allocated, weights included now that loading copies them out of the file mapping) from a baseline
taken after the engine has started and the model's code is imported, over the same steps: load
the model, a picture turn, a long turn. Goal: |dock − measured| ÷ measured ≤ 0.05 after each step.
The resident file-backed pages (RssFile) are shown beside it and left out of the goal: they are
the shared libraries' code, paged in as kernels first run (tens of MiB), not data the dock counts.

    python tests/bench/memory_ledger.py [--long-tokens 4096] [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import json

from _common import parse_args, precision, ratio_line, workdir

from engine.device.heap_trim import return_freed_heap
from engine.local.engine import Engine
from engine.protocol.client import load_blocking
from engine.protocol.events import Message
from engine.protocol.settings import EngineSettings
from tests.fixtures.pictures import make_picture, pics
from tests.fixtures.published_configs import build_published
from tests.helpers.engine_helpers import ask, expect_done, wait_report

SHAPE = "SmolVLM-256M-Instruct"
QUICK = {"layers": 2, "vision_layers": 2, "vocab_size": 4096}
IN_PROCESS = ("language_model", "vision_encoder", "processor", "kernels", "hot_kv", "image_cache_ram")
WORDS = (
    "a small red house beside a quiet river with two children playing on the grass while "
    "a brown dog runs after a yellow ball under tall green trees "
).split()


def ledger_error(dock: int, measured: int) -> float:
    """|dock − measured| ÷ measured; a growth under 1 MiB (the quick model's load can even shrink
    the heap) is taken as 1 MiB, so that it reads as a large error, not a negative one."""
    return abs(dock - measured) / max(measured, 1 << 20)


def resident() -> dict[str, int]:
    """RssAnon and RssFile of this process, in bytes."""
    gc.collect()
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f if line.startswith(("RssAnon", "RssFile")))
    return {k: int(v.split()[0]) * 1024 for k, v in fields.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--long-tokens", type=int, default=4096, help="length of the long turn's prompt")
    ap.add_argument("--json", default=None, help="write the measured steps here")
    args = parse_args(ap, quick={"long_tokens": 512})
    reduce = QUICK if args.quick else {}
    # --quick: both named (precision), so a CPU without bf16 units computes in fp32 and nothing
    # calibrates; the full run keeps bf16 with the weight format the calibration picks
    dtype = precision(True) if args.quick else {"dtype": "bfloat16"}
    model_dir = build_published(SHAPE, **reduce)
    d = workdir("ledger")
    pic = make_picture(d / "p.png", 1, size=(640, 480))
    long_text = " ".join(WORDS[i % len(WORDS)] for i in range(int(args.long_tokens * 0.7)))

    # code the load will import, so the baseline already holds it (the dock counts data, not code)
    import transformers.models.idefics3.modeling_idefics3  # noqa: F401
    from PIL import Image  # noqa: F401

    engine = Engine(
        EngineSettings().with_changes({**dtype, "elastic_idle_s": 86400.0, "spill_idle_s": 86400.0}),
        d / "data",
    ).start()
    steps = []
    try:
        base = resident()

        def record(step: str, detail: str = "") -> None:
            report = wait_report(engine)
            parts = {k: report.components.get(k, 0) for k in IN_PROCESS}
            now = resident()
            dock, grown, code = sum(parts.values()), now["RssAnon"] - base["RssAnon"], now["RssFile"] - base["RssFile"]
            steps.append({"step": step, "dock": dock, "measured": grown, "file_backed": code, "components": parts})
            shown = ", ".join(f"{k} {v / 2**20:.1f}" for k, v in parts.items())
            print(
                f"after {step}{detail}: dock {dock / 2**20:.1f} MiB ({shown}) | anonymous RSS growth "
                f"{grown / 2**20:.1f} MiB (+ {code / 2**20:.1f} MiB file-backed: library code)"
            )
            print(ratio_line(f"ledger error after {step}", ledger_error(dock, grown), at_most=0.05))

        load_blocking(engine, str(model_dir))
        record("load")
        done = expect_done(ask(engine, "picture", [Message("user", "What is in this picture?", pics(pic))], 8))
        record(
            "a picture turn",
            f" ({done.stats.prompt_tokens} tokens, encoder "
            f"{'resident' if done.stats.encoder_resident else 'unloaded'})",
        )
        done = expect_done(ask(engine, "long", [Message("user", long_text)], 8))
        record("a long turn", f" ({done.stats.prompt_tokens} tokens)")
        # heap the allocator still keeps after freeing (the engine trims after each turn: ~0 left)
        return_freed_heap()
        trimmed = resident()["RssAnon"] - base["RssAnon"]
        print(
            ratio_line(
                "anonymous RSS growth after another malloc_trim(0)",
                trimmed / 2**20,
                unit="MiB",
                digits=1,
                note=f"dock {steps[-1]['dock'] / 2**20:.1f} MiB; error "
                f"{ledger_error(steps[-1]['dock'], trimmed):.3f} once freed heap is returned",
            )
        )
        steps.append({"step": "after malloc_trim", "dock": steps[-1]["dock"], "measured": trimmed})
    finally:
        engine.shutdown()
    worst = max(ledger_error(s["dock"], s["measured"]) for s in steps[:3])
    print(ratio_line("worst ledger error over the steps", worst, at_most=0.05))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape": SHAPE, "quick": bool(args.quick), "steps": steps}, f, indent=1)


if __name__ == "__main__":
    main()
