"""Pulling a model from the local hub stand-in: what Parley's pull costs over a plain HTTP GET,
and how much a dropped connection makes it fetch again. Measured side by side in one run.

- Parley's pull (plan: model info + folder check; small files through hf_hub_download; the
  weights through the resumable, SHA-256-checked fetch into the HF cache) ÷ a plain streaming GET
  of the same weight bytes into a file (same HTTP client library, no checks); goal ≤ 1.10.
  Median of the per-round ratios, the order alternating (the machine may be shared).
- A drop at 50 %: the bytes fetched after the drop ÷ the file size; goal ≤ 0.55. The same after a
  cancel at 50 % and a fresh pull (as after an app restart).
Sizes: a 200 MB model (--quick: 20 MB).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import threading
import time

import pytest
from _common import ratio_line, workdir

from tests.fixtures.hub_standin import safetensors_bytes, start_standin

BIG = "model.safetensors"


def plain_get(client, url: str, dest) -> int:
    n = 0
    with open(dest, "wb") as out, client.stream("GET", url) as r:
        r.raise_for_status()
        for chunk in r.iter_bytes():
            out.write(chunk)
            n += len(chunk)
    return n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    size_mb, rounds = (20, 3) if args.quick else (200, 5)
    work = workdir("download")
    mp = pytest.MonkeyPatch()
    hub = start_standin(mp, work / "hub")
    from engine.library import pull as pull_mod
    from engine.library.fetch import Cancelled
    from engine.library.hub import hub_cache_dir

    repo = hub.add_repo(
        "bench/model",
        {
            "config.json": b'{"model_type": "llava"}',
            "chat_template.jinja": b"{{ messages }}",
            BIG: safetensors_bytes(size_mb << 20),
        },
    )
    size = len(repo.files[BIG].data)
    url = f"{hub.cdn_url}/lfs/{repo.files[BIG].sha256}"
    print(f"model: {size / 1e6:.0f} MB of weights + 2 small files; {rounds} rounds; stand-in at {hub.url}")

    def parley_pull() -> float:
        shutil.rmtree(hub_cache_dir(), ignore_errors=True)
        t = time.perf_counter()
        pull_mod.pull(pull_mod.plan_pull("bench/model"))
        return time.perf_counter() - t

    import httpx2

    client = httpx2.Client(follow_redirects=True, timeout=None)  # kept warm, as huggingface_hub's session is

    def baseline() -> float:
        dest = work / "plain.bin"
        t = time.perf_counter()
        assert plain_get(client, url, dest) == size
        took = time.perf_counter() - t
        dest.unlink()
        return took

    parley_pull(), baseline()  # warm up both paths (imports, page cache of the served bytes)
    ratios, p_times, b_times = [], [], []
    for i in range(rounds):
        if i % 2:
            b, p = baseline(), parley_pull()
        else:
            p, b = parley_pull(), baseline()
        ratios.append(p / b)
        p_times.append(p)
        b_times.append(b)
    ratio = statistics.median(ratios)
    print(
        f"parley pull: median {statistics.median(p_times):.3f} s "
        f"({size / statistics.median(p_times) / 1e6:.0f} MB/s); "
        f"plain GET: median {statistics.median(b_times):.3f} s ({size / statistics.median(b_times) / 1e6:.0f} MB/s)"
    )
    print(ratio_line("pull / plain GET", ratio, at_most=1.10))

    # a connection dropped at 50 %: the in-pull retry asks for the rest with Range
    shutil.rmtree(hub_cache_dir(), ignore_errors=True)
    hub.sent.clear()
    hub.faults.drop_after[BIG] = size // 2
    pull_mod.pull(pull_mod.plan_pull("bench/model"))
    drop = (hub.sent[BIG] - size // 2) / size
    print(ratio_line("after a drop at 50%: bytes fetched again / file size", drop, at_most=0.55))

    # a cancel at 50 %, then a new pull (what an app restart does)
    shutil.rmtree(hub_cache_dir(), ignore_errors=True)
    hub.sent.clear()
    cancel = threading.Event()
    stop_at = threading.Event()
    hub.faults.hold_at[BIG] = (size // 2, stop_at)

    def on_progress(p):
        if p.file == BIG and p.done_bytes >= size // 2 - (1 << 20):
            cancel.set()
            stop_at.set()

    try:
        pull_mod.pull(pull_mod.plan_pull("bench/model"), on_progress, cancel)
    except Cancelled:
        pass
    sent_before = hub.sent.get(BIG, 0)
    part = hub_cache_dir() / "models--bench--model" / "blobs" / (repo.files[BIG].sha256 + ".parley-part")
    kept = part.stat().st_size
    hub.sent[BIG] = 0
    pull_mod.pull(pull_mod.plan_pull("bench/model"))
    again = hub.sent[BIG] / size
    print(f"cancelled with {kept / size:.0%} on disk ({sent_before / size:.0%} sent)")
    print(ratio_line("after a cancel and a new pull: bytes fetched again / file size", again, at_most=0.55))
    client.close()
    hub.stop()
    mp.undo()
    return 0


if __name__ == "__main__":
    sys.exit(main())
