"""Follow-up spill after +k tokens vs a full spill of the same conversation, side by side.

KV shaped like a 1.5B LLM (Qwen2.5-1.5B: 28 layers, 2 KV heads, head_dim 128, bf16; 28 KiB per
token). For each k: spill N tokens from scratch (timed: full), then the same conversation k
tokens later (timed: incremental). Goal: incremental <= 1.2 * k/N * full + 20 ms, and blocks
written <= ceil(k/256) + 1. Runs on CPU tensors here; on a GPU the copies are device->host.

    python tests/bench/spill_incremental.py [--n 8300] [--ks 0,64,256,1024] [--reps 5] [--dir PATH] [--quick]
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import tempfile
import time

import torch  # noqa: E402
from _common import parse_args, ratio_line  # noqa: E402  (puts the project root on sys.path)

from engine.kvstore import KVStore  # noqa: E402
from engine.kvstore.layout import build_cache  # noqa: E402

LAYERS, HEADS, DIM, DTYPE = 28, 2, 128, torch.bfloat16


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8300, help="tokens in the conversation (>= 8K)")
    ap.add_argument("--ks", default="0,64,256,1024", help="follow-up sizes (0: the fixed cost)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default=None, help="store directory (default: a temp dir on /tmp's disk)")
    args = parse_args(ap, quick={"n": 1500, "ks": "0,64,256", "reps": 2})
    N = args.n
    ks = [int(x) for x in args.ks.split(",")]
    kmax = max(ks)
    torch.manual_seed(0)
    # one random KV long enough for every follow-up; a conversation is a prefix of it
    kv = [
        (torch.randn(1, HEADS, N + kmax, DIM, dtype=DTYPE), torch.randn(1, HEADS, N + kmax, DIM, dtype=DTYPE))
        for _ in range(LAYERS)
    ]
    per_token = LAYERS * 2 * HEADS * DIM * 2
    root = args.dir or tempfile.mkdtemp(prefix="kvbench-inc-")
    print(
        f"KV layout: {LAYERS} layers x {HEADS} kv heads x {DIM} dims {str(DTYPE)[6:]} = {per_token} B/token; "
        f"N = {N} tokens = {N * per_token / 2**20:.0f} MiB; store in {root}"
    )
    print(
        f"{'k':>6} {'full ms':>9} {'incr ms':>9} {'ratio':>7} {'k/N':>7} {'goal ms':>9} "
        f"{'blocks':>6} {'bound':>5} {'MiB written':>11}  ok"
    )
    rep_seed = 0
    worst, blocks_ok = 0.0, True  # the goal line: the largest incremental time / its goal, over every k
    with KVStore(root, b"bench-1.5b", min_free_bytes=256 << 20, max_bytes=64 << 30) as store:
        for k in ks:
            fulls, incs, blocks, written = [], [], [], []
            for _ in range(args.reps):
                rep_seed += 1
                # fresh token ids per repetition: nothing from a previous rep can be reused
                gen = torch.Generator().manual_seed(rep_seed)
                toks = torch.randint(0, 150_000, (N + kmax,), generator=gen).tolist()
                sid = f"conv{rep_seed}"
                c1 = build_cache([(k_[:, :, :N], v_[:, :, :N]) for k_, v_ in kv])
                t = time.perf_counter()
                r1 = store.spill(sid, toks[:N], [], c1)
                fulls.append(time.perf_counter() - t)
                assert r1.ok, r1.error
                c2 = build_cache([(k_[:, :, : N + k], v_[:, :, : N + k]) for k_, v_ in kv])
                t = time.perf_counter()
                r2 = store.spill(sid, toks[: N + k], [], c2)
                incs.append(time.perf_counter() - t)
                assert r2.ok, r2.error
                blocks.append(r2.blocks_written)
                written.append(r2.bytes_written)
                store.drop_session(sid)
            full, inc = statistics.median(fulls), statistics.median(incs)
            goal = 1.2 * k / N * full + 0.020
            bound = math.ceil(k / 256) + 1
            ok = inc <= goal and max(blocks) <= bound
            worst, blocks_ok = max(worst, inc / goal), blocks_ok and max(blocks) <= bound
            print(
                f"{k:>6} {full * 1e3:>9.1f} {inc * 1e3:>9.1f} {inc / full:>7.4f} {k / N:>7.4f} {goal * 1e3:>9.1f} "
                f"{max(blocks):>6} {bound:>5} {statistics.median(written) / 2**20:>11.2f}  {'yes' if ok else 'no'}"
            )
    print(
        ratio_line(
            "incremental spill time / its goal (1.2·k/N·full + 20 ms), worst k",
            worst,
            at_most=1.0,
            also=("blocks written ≤ ceil(k/256) + 1", blocks_ok),
        )
    )
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
