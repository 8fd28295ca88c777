"""Peak extra resident memory while spilling >= 2 GiB of KV, in units of unit_bytes.

The device->host copies go through two reusable host buffers of unit_bytes, so the extra memory
a spill needs should stay near 2 units whatever the session length. Measured with the kernel's
peak-RSS counter (reset through /proc/self/clear_refs just before the spill) and cross-checked by
a 1 ms RSS sampler. Goal: peak extra RSS / unit_bytes <= 2.

    python tests/bench/spill_memory.py [--gib 2.1] [--unit-mib 32] [--dir PATH] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import tempfile
import threading
import time

import torch  # noqa: E402
from _common import parse_args, ratio_line  # noqa: E402  (puts the project root on sys.path)

from engine.kvstore import KVStore  # noqa: E402
from engine.kvstore.layout import build_cache  # noqa: E402

LAYERS, HEADS, DIM, DTYPE = 28, 4, 128, torch.bfloat16  # 56 KiB per token


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def hwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=2.1)
    ap.add_argument("--unit-mib", type=int, default=32)
    ap.add_argument("--dir", default=None)
    args = parse_args(ap, quick={"gib": 0.25, "unit_mib": 8})
    unit = args.unit_mib << 20
    per_token = LAYERS * 2 * HEADS * DIM * DTYPE.itemsize
    n = int(args.gib * 2**30 / per_token)
    root = args.dir or tempfile.mkdtemp(prefix="kvbench-mem-")
    torch.manual_seed(0)
    kv = []
    for _ in range(LAYERS):  # filled in place: no temporary copies inflate the baseline
        k = torch.empty(1, HEADS, n, DIM, dtype=DTYPE)
        v = torch.empty(1, HEADS, n, DIM, dtype=DTYPE)
        k.view(torch.int16).random_(-(2**15), 2**15)
        v.view(torch.int16).random_(-(2**15), 2**15)
        kv.append((k, v))
    cache = build_cache(kv)
    tokens = torch.randint(0, 150_000, (n,)).tolist()
    kv_bytes = n * per_token
    store = KVStore(root, b"bench-mem", unit_bytes=unit, min_free_bytes=512 << 20, max_bytes=64 << 30, pin_memory=False)
    # warm the code paths (imports, SQLite) on a tiny spill so the baseline holds them
    small = build_cache([(k[:, :, :300], v[:, :, :300]) for k, v in kv])
    assert store.spill("warm", tokens[:300], [], small).ok
    store.drop_session("warm")
    # the warm-up allocated the two buffers; give them back so the measurement includes them
    assert store.release_buffers()
    del small
    gc.collect()
    base = rss()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    peak_sampled = [base]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak_sampled[0] = max(peak_sampled[0], rss())
            time.sleep(0.001)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    t = time.perf_counter()
    job = store.begin_spill("big", tokens, [], cache)
    steps = 0
    while not job.step():
        steps += 1
    res = job.result()
    dt = time.perf_counter() - t
    stop.set()
    th.join()
    assert res.ok, res.error
    extra_hwm = hwm() - base
    extra_sampled = peak_sampled[0] - base
    print(
        f"KV {kv_bytes / 2**30:.2f} GiB ({n} tokens, {LAYERS}x{HEADS}x{DIM} {str(DTYPE)[6:]}), "
        f"unit {args.unit_mib} MiB, "
        f"{steps + 1} units, {res.blocks_written} blocks + {res.tail_written} tail written in {dt:.2f} s "
        f"({res.bytes_written / dt / 2**20:.0f} MiB/s)"
    )
    print(f"peak extra RSS (VmHWM)   : {extra_hwm / 2**20:8.1f} MiB = {extra_hwm / unit:.2f} x unit_bytes")
    print(f"peak extra RSS (sampled) : {extra_sampled / 2**20:8.1f} MiB = {extra_sampled / unit:.2f} x unit_bytes")
    print(ratio_line("peak extra RSS (VmHWM) / unit_bytes", extra_hwm / unit, at_most=2.0, digits=2))
    store.close()
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
