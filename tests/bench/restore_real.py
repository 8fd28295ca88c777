"""Resume from the SSD store ÷ re-prefill at the published Qwen2.5-VL-3B shape (bf16, CPU), with
the spill's throughput and peak extra memory, and incremental spill time against new tokens.

For each conversation length (default 2K, 8K and 32K tokens): turn 1 prefills the conversation
(its time to first token is the re-prefill figure: a fresh engine would prefill the same tokens
plus the follow-up's ~20, under 1% more at these lengths, so the slow prefill runs once per
length); spill-now writes the KV to the store (timed, peak extra RSS from the kernel's VmHWM reset
just before); the follow-up turn restores it and prefills only the new text. Goal: TTFT resume ÷
TTFT re-prefill ≤ 0.05. A length whose prefill, estimated from the measured one (linear + causal
attention FLOPs), would exceed --budget-min is not run, and the output says so. Then the shortest
conversation grows by --grow new tokens at a time, spilling after each (only new blocks are
written): spill time against new tokens.

--dtype float32 runs the same shape in the precision the app picks on a CPU (dtype=auto): on a CPU
without bf16 units (AVX2 only) that is 3.5–6.5x faster, which brings the 32K length within budget.

    python tests/bench/restore_real.py [--tokens 2048 8192 32768] [--dtype bfloat16|float32]
                                       [--budget-min 30] [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

from _common import parse_args, precision, ratio_line, workdir

from engine.protocol.events import Message, SpillState
from tests.fixtures.published_configs import build_published, spec_for
from tests.helpers.engine_helpers import ask, expect_done, open_engine, wait_report

SHAPE = "Qwen2.5-VL-3B-Instruct"
QUICK = {"layers": 2, "vision_layers": 2, "vocab_size": 4096}
WORDS = (
    "the quick brown fox jumps over the lazy dog while a red circle rolls past a blue "
    "square and a green triangle watches quietly from the corner of the picture "
).split()


def text_of(tokens: int, start: int = 0) -> str:
    return " ".join(WORDS[(start + i) % len(WORDS)] for i in range(int(tokens * 0.61)))


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def hwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def spill(engine, cid) -> tuple[float, int, str]:
    """Spill now; (seconds, peak extra RSS bytes, the store's 'N written, M reused')."""
    done, detail = threading.Event(), []

    def on(e):
        if isinstance(e, SpillState) and e.conversation_id == cid and e.state in ("spilled", "failed", "refused"):
            detail.append(f"{e.state}: {e.detail}")
            done.set()

    engine.add_listener(on)
    base = rss()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := current RSS
    t0 = time.perf_counter()
    engine.spill_now(cid)
    assert done.wait(1800), "no spill result"
    dt = time.perf_counter() - t0
    engine.remove_listener(on)
    assert detail[0].startswith("spilled"), detail[0]
    return dt, hwm() - base, detail[0].removeprefix("spilled: ")


def flops(spec: dict, tokens: int) -> float:
    """Prefill FLOPs: 2 · weights · tokens, plus causal attention (QKᵀ and AV: 2 · L² · width per layer)."""
    t = spec["text"]
    per_layer = (
        2 * t["hidden_size"] ** 2
        + 2 * t["hidden_size"] * t["num_key_value_heads"] * (t["hidden_size"] // t["num_attention_heads"])
        + 3 * t["hidden_size"] * t["intermediate_size"]
    )
    return 2 * per_layer * t["num_hidden_layers"] * tokens + 2 * t["num_hidden_layers"] * t["hidden_size"] * tokens**2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192, 32768])
    ap.add_argument("--grow", type=int, nargs="+", default=[64, 256, 1024], help="new tokens per growth step")
    ap.add_argument("--budget-min", type=float, default=30.0, help="skip a length whose prefill would take longer")
    ap.add_argument("--json", default=None, help="write the measured series here (for the report's charts)")
    ap.add_argument(
        "--dtype",
        choices=("bfloat16", "float32"),
        default="bfloat16",
        help="weights and KV precision (float32 is what dtype=auto picks on a CPU)",
    )
    # quick: the precision the CPU runs fast (precision()), the test suite's time on AVX2-only CPUs
    args = parse_args(ap, quick={"tokens": [512, 1024], "grow": [32, 128], "dtype": precision(True)["dtype"]})
    reduce = QUICK if args.quick else {}
    spec = spec_for(SHAPE, **reduce)
    t = spec["text"]
    head_dim = t["hidden_size"] // t["num_attention_heads"]
    kv_per_token = (
        2 * t["num_hidden_layers"] * t["num_key_value_heads"] * head_dim * (2 if args.dtype == "bfloat16" else 4)
    )
    t0 = time.perf_counter()
    model_dir = build_published(SHAPE, **reduce)
    print(
        f"shape {SHAPE}{' (quick: ' + str(reduce) + ')' if reduce else ''}: {t['num_hidden_layers']} layers, "
        f"{t['num_key_value_heads']} KV heads x {t['hidden_size'] // t['num_attention_heads']}, {args.dtype} on CPU, "
        f"KV {kv_per_token / 1024:.0f} KiB per token; model folder ready in {time.perf_counter() - t0:.0f} s"
    )
    d = workdir("restore-real")
    series = {
        "shape": SHAPE,
        "dtype": args.dtype,
        "quick": bool(args.quick),
        "lengths": [],
        "skipped": [],
        "spills": [],
    }
    engine = open_engine(
        model_dir,
        d / "data",
        dtype=args.dtype,
        weights={"bfloat16": "bf16", "float32": "fp32"}[args.dtype],  # named: no format calibration first
        spill_idle_s=86400,
        elastic_idle_s=86400,
    )
    measured = None  # (tokens, prefill seconds) of the last length that ran
    grow_from = None  # the shortest conversation: (id, messages, last reply, prompt tokens)
    try:
        expect_done(ask(engine, "warm-up", [Message("user", "Hello there.")], 1))  # one-time kernel set-up
        for n, target in enumerate(sorted(args.tokens)):
            if measured is not None:
                est = measured[1] * flops(spec, target) / flops(spec, measured[0])
                if est > args.budget_min * 60:
                    why = (
                        f"re-prefill of {target} tokens not run: estimated {est / 60:.0f} min from the measured "
                        f"{measured[0]}-token prefill ({measured[1]:.0f} s), over the {args.budget_min:g}-min "
                        f"budget (--budget-min)"
                    )
                    print(why)
                    series["skipped"].append({"tokens": target, "estimated_s": est, "why": why})
                    continue
            cid = f"c{target}"
            opening = [Message("user", text_of(target, n))]
            first = expect_done(ask(engine, cid, opening, 1))
            L, prefill = first.stats.prompt_tokens, first.stats.first_token_s
            measured = (L, prefill)
            kv = wait_report(engine).sessions_kv[cid]
            spill_s, peak, detail = spill(engine, cid)
            follow = opening + [Message("assistant", first.reply), Message("user", "Summarise that in one line.")]
            resumed = expect_done(ask(engine, cid, follow, 1))
            s = resumed.stats
            ttft = s.restore_s + s.first_token_s
            print(
                f"{L} tokens: re-prefill TTFT {prefill:.1f} s | spill {kv / 2**20:.0f} MiB in {spill_s:.2f} s "
                f"({kv / 2**20 / spill_s:.0f} MiB/s, {detail}), peak extra RSS {peak / 2**20:.0f} MiB | "
                f"resume: restored {s.restored_tokens} tokens in {s.restore_s * 1000:.0f} ms, prefilled "
                f"{s.prefill_tokens}, TTFT {ttft * 1000:.0f} ms"
            )
            print(ratio_line(f"TTFT resume / TTFT re-prefill at {L} tokens", ttft / prefill, at_most=0.05, digits=4))
            print(
                ratio_line(
                    f"spill throughput at {L} tokens",
                    kv / 2**20 / spill_s,
                    unit="MiB/s",
                    digits=0,
                    note=f"{kv / 2**20:.0f} MiB of KV",
                )
            )
            print(
                ratio_line(
                    f"spill peak extra RSS at {L} tokens",
                    peak / 2**20,
                    unit="MiB",
                    digits=0,
                    note=f"{peak / kv:.2f} x the KV spilled",
                )
            )
            series["lengths"].append(
                {
                    "tokens": L,
                    "reprefill_s": prefill,
                    "restore_s": s.restore_s,
                    "resume_ttft_s": ttft,
                    "kv_bytes": kv,
                    "spill_s": spill_s,
                    "spill_peak_extra_bytes": peak,
                }
            )
            series["spills"].append({"new_tokens": L, "spill_s": spill_s, "kind": "first spill", "detail": detail})
            if grow_from is None:
                grow_from = (cid, follow, resumed.reply, s.prompt_tokens)
        # grow the shortest conversation: each spill writes only the blocks that are new
        cid, conv, reply, before = grow_from
        spill(engine, cid)  # the resume turn added a few tokens: start from a fully spilled conversation
        for k, grow in enumerate(args.grow):
            conv = conv + [Message("assistant", reply), Message("user", text_of(grow, 7 + k))]
            done = expect_done(ask(engine, cid, conv, 1))
            reply = done.reply
            new, before = done.stats.prompt_tokens - before, done.stats.prompt_tokens
            spill_s, _, detail = spill(engine, cid)
            print(
                f"grew by {new} tokens to {before} (restored {done.stats.restored_tokens}, prefilled "
                f"{done.stats.prefill_tokens}): spill {spill_s * 1000:.0f} ms ({detail})"
            )
            print(
                ratio_line(f"incremental spill of {new} new tokens", spill_s * 1000, unit="ms", digits=0, note=detail)
            )
            series["spills"].append({"new_tokens": new, "spill_s": spill_s, "kind": "incremental", "detail": detail})
    finally:
        engine.shutdown()
    for skipped in series["skipped"]:
        print(f"NOT RUN: {skipped['why']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(series, f, indent=1)


if __name__ == "__main__":
    main()
