"""Store-side restore throughput vs a plain read of the same bytes, side by side.

Restore = open, read, verify (header + payload BLAKE3, key, token ids, shapes) and place every
blob of a session into fresh per-layer tensors, then build the DynamicCache. Plain = read the
same files into one fresh buffer with one read per file and nothing else. Both allocate fresh
memory, so both pay the same page faults. Measured with the files in the page cache (hot) and
evicted from it with posix_fadvise(DONTNEED) (cold: what a restore after idle or restart sees).
Goal: restore throughput / plain throughput >= 0.7.

    python tests/bench/restore_throughput.py [--gib 1.0] [--reps 4] [--dir PATH] [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import torch  # noqa: E402
from _common import parse_args, ratio_line  # noqa: E402  (puts the project root on sys.path)

from engine.kvstore import KVStore  # noqa: E402
from engine.kvstore.blob import blob_path  # noqa: E402
from engine.kvstore.layout import build_cache  # noqa: E402

LAYERS, HEADS, DIM, DTYPE = 28, 2, 128, torch.bfloat16  # Qwen2.5-1.5B-like, 28 KiB per token


def drop_cache(paths: list[str]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def plain_read(paths: list[str], sizes: list[int], buf=None) -> float:
    t = time.perf_counter()
    if buf is None:
        buf = torch.empty(sum(sizes), dtype=torch.uint8).numpy()  # same allocator as the restore's tensors
    off = 0
    for p, n in zip(paths, sizes, strict=True):
        with open(p, "rb", buffering=0) as f:
            got = f.readinto(memoryview(buf)[off : off + n])
            assert got == n
        off += n
    dt = time.perf_counter() - t
    del buf
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--dir", default=None)
    args = parse_args(ap, quick={"gib": 0.05, "reps": 2})
    per_token = LAYERS * 2 * HEADS * DIM * DTYPE.itemsize
    n = int(args.gib * 2**30 / per_token)
    root = args.dir or tempfile.mkdtemp(prefix="kvbench-restore-")
    kv = []
    for _ in range(LAYERS):
        k = torch.empty(1, HEADS, n, DIM, dtype=DTYPE)
        v = torch.empty(1, HEADS, n, DIM, dtype=DTYPE)
        k.view(torch.int16).random_(-(2**15), 2**15)
        v.view(torch.int16).random_(-(2**15), 2**15)
        kv.append((k, v))
    tokens = torch.randint(0, 150_000, (n,)).tolist()
    with KVStore(root, b"bench-restore", min_free_bytes=512 << 20, max_bytes=64 << 30) as store:
        res = store.spill("conv", tokens, [], build_cache(kv))
        assert res.ok, res.error
        info = store.session_info("conv")
        keys = info["block_keys"] + ([info["tail_key"]] if info["tail_key"] else [])
        paths = [blob_path(store.blobs_dir, k) for k in keys]
        sizes = [os.path.getsize(p) for p in paths]
        total = sum(sizes)
        # correctness once, outside the timings
        out = store.restore("conv", tokens)
        assert out.n_tokens == n and all(  # bit patterns (random bits include NaNs)
            torch.equal(layer.keys.view(torch.int16), k.view(torch.int16))
            and torch.equal(layer.values.view(torch.int16), v.view(torch.int16))
            for layer, (k, v) in zip(out.cache.layers, kv, strict=True)
        )
        del out
        del kv
        print(
            f"session: {n} tokens, {len(paths)} blobs, {total / 2**30:.2f} GiB "
            f"({LAYERS}x{HEADS}x{DIM} {str(DTYPE)[6:]}); store in {root}"
        )
        print(
            f"{'cache':>5} {'plain GiB/s':>12} {'restore GiB/s':>14} {'ratio':>7}  goal >= 0.7   "
            f"(plain into an already-faulted buffer: GiB/s, ratio)"
        )
        prefaulted = torch.zeros(total, dtype=torch.uint8).numpy()
        goal_lines = []
        for mode in ("cold", "hot"):
            plains, restores, pre = [], [], []
            for rep in range(args.reps):
                for which in ("plain", "restore") if rep % 2 == 0 else ("restore", "plain"):
                    if mode == "cold":  # alternate the order: a host-side cache must not favour one
                        drop_cache(paths)
                    if which == "plain":
                        plains.append(plain_read(paths, sizes))
                        if mode == "cold":
                            drop_cache(paths)
                        pre.append(plain_read(paths, sizes, prefaulted))
                    else:
                        t = time.perf_counter()
                        out = store.restore("conv", tokens)
                        restores.append(time.perf_counter() - t)
                        assert out.n_tokens == n
                        del out
            p, r, q = statistics.median(plains), statistics.median(restores), statistics.median(pre)
            print(
                f"{mode:>5} {total / p / 2**30:>12.2f} {total / r / 2**30:>14.2f} {p / r:>7.2f}  "
                f"{'yes' if p / r >= 0.7 else 'no':<11} ({total / q / 2**30:.2f}, {q / r:.2f})"
            )
            goal_lines.append(ratio_line(f"restore / plain read throughput, {mode} page cache", p / r, at_least=0.7))
        print("\n".join(goal_lines))
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
