"""SSD KV block store under faults: SIGKILL mid-spill, unwritable directory, disk full.

Processes are forked from one "zygote" that imported torch once, so each trial costs a fork
instead of a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from engine.kvstore import KVStore

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the writers are forked (POSIX only)")

REPO = str(Path(__file__).resolve().parents[3])
NS = b"crash-model"

# Shared by the test and the forked writers: deterministic tokens and K/V for a session id and
# a length, so the parent knows the exact data any committed row must restore to.
HELPERS = r"""
import torch
from transformers import DynamicCache
from engine.pictures.span import PictureKey, PictureSpan

def crash_tokens(sid, n):
    group = int(sid[1:]) % 2          # s0/s2 and s1/s3 share their first 40 tokens
    out = []
    for p in range(n):
        t = (p * 31 + 7 + 1000 * group) % 5000
        if p >= 40:
            t = (t + 97 * int(sid[1:])) % 5000
        out.append(t)
    return out

def crash_pictures(n):
    return [PictureSpan(20, 30, PictureKey(b"picture-1"))] if n >= 30 else []

def crash_kv(toks, layers=3, heads=2, dim=8):
    t = torch.tensor(toks, dtype=torch.float32)[None, :, None]
    p = torch.arange(len(toks), dtype=torch.float32)[None, :, None]
    h = torch.arange(heads, dtype=torch.float32)[:, None, None]
    d = torch.arange(dim, dtype=torch.float32)[None, None, :]
    out = []
    for l in range(layers):
        k = ((t * 3 + p * 5 + h * 7 + d * 11 + l * 13) % 251 / 251).to(torch.float16)[None]
        v = ((t * 5 + p * 3 + h * 11 + d * 7 + l * 17) % 241 / 241).to(torch.float16)[None]
        out.append((k, v))
    return out

def crash_cache(toks):
    return DynamicCache(ddp_cache_data=crash_kv(toks))
"""
_helpers: dict = {}
exec(HELPERS, _helpers)  # noqa: S102  the same code runs in the forked writers
crash_tokens, crash_pictures = _helpers["crash_tokens"], _helpers["crash_pictures"]
crash_kv, crash_cache = _helpers["crash_kv"], _helpers["crash_cache"]

ZYGOTE = (
    HELPERS
    + r"""
import os, sys, json, random, signal, resource
torch.set_num_threads(1)
from engine.kvstore import KVStore

def spill_loop(root, seed, ready):
    open(ready, "w").close()
    rng = random.Random(seed)
    s = KVStore(root, b"crash-model", block_tokens=16, unit_bytes=4096, max_bytes=60_000,
                min_free_bytes=0)
    while True:
        sid = "s%d" % rng.randrange(4)
        n = rng.randrange(1, 160)
        toks = crash_tokens(sid, n)
        job = s.begin_spill(sid, toks, crash_pictures(n), crash_cache(toks), {"n": n})
        while not job.step():
            pass
        job.result()
        if rng.random() < 0.2:
            s.restore(sid, toks, crash_pictures(n))
        if rng.random() < 0.05:
            s.drop_session(sid)

def disk_full(root, limit, out):
    # a real write failure even as root: the file-size limit makes write() fail with EFBIG
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    s = KVStore(root, b"crash-model", block_tokens=1024, min_free_bytes=0)
    small = crash_tokens("s0", 40)
    first = s.spill("s0", small, [], crash_cache(small))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    big = crash_tokens("s1", 2000)
    cache = crash_cache(big)
    before = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    second = s.spill("s1", big, [], cache)
    intact = all(torch.equal(l.keys, k) and torch.equal(l.values, v) for l, (k, v) in zip(cache.layers, before))
    back = s.restore("s0", small)
    exact = back.n_tokens == 40 and all(
        torch.equal(l.keys, k) and torch.equal(l.values, v)
        for l, (k, v) in zip(back.cache.layers, crash_kv(small)))
    res = {"first_ok": first.ok, "second_ok": second.ok, "error": second.error, "intact": intact,
           "restored_exact": exact, "sessions": s.sessions()}
    s.close()
    with open(out, "w") as f:
        json.dump(res, f)

print("up", flush=True)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "reap":
        os.waitpid(int(cmd[1]), 0)
        print("reaped", flush=True)
        continue
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            if cmd[0] == "spill":
                spill_loop(cmd[1], int(cmd[2]), cmd[3])
            elif cmd[0] == "full":
                disk_full(cmd[1], int(cmd[2]), cmd[3])
        except BaseException:
            import traceback; traceback.print_exc()
            code = 1
        os._exit(code)
    print(pid, flush=True)
"""
)


@pytest.fixture(scope="module")
def zygote():
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO, env=env
    )
    assert proc.stdout.readline().strip() == "up"

    def run(*args: str) -> int:
        proc.stdin.write(" ".join(args) + "\n")
        proc.stdin.flush()
        return int(proc.stdout.readline())

    def reap(pid: int) -> None:
        proc.stdin.write(f"reap {pid}\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "reaped"

    yield run, reap
    proc.stdin.close()
    proc.wait(timeout=30)


def _check_consistent(root: str) -> int:
    """Reopen (startup sweep), then: every row's blobs exist and verify, refcounts match, no temp
    or orphan files, and each session restores to exactly its deterministic data."""
    with KVStore(root, NS, block_tokens=16, min_free_bytes=0, max_bytes=60_000) as s:
        v = s.verify()
        assert not v["bad"] and not v["missing"] and not v["refcount_errors"], v
        names = set()
        for _, _, files in os.walk(s.blobs_dir):
            for name in files:
                assert not name.endswith(".tmp"), name
                names.add(name)
        rows = s.index.blob_rows()
        assert names == {k.hex() + ".kvb" for k in rows}
        assert all(rc > 0 for _, rc in rows.values())
        for sid in s.sessions():
            info = s.session_info(sid)
            n = info["n_tokens"]
            assert info["state"] == {"n": n}
            toks = crash_tokens(sid, n)
            out = s.restore(sid, toks, crash_pictures(n), cut_pictures=False)
            assert out.n_tokens == n and out.stats.bad_blobs == 0 and out.stats.missing_blobs == 0
            for layer, (k, v) in zip(out.cache.layers, crash_kv(toks), strict=True):
                assert torch.equal(layer.keys, k) and torch.equal(layer.values, v)
        return len(s.sessions())


@pytest.mark.slow
def test_sigkill_during_spills_leaves_a_consistent_store(zygote, tmp_path):
    run, reap = zygote
    root = str(tmp_path / "kv")
    rng = random.Random(1234)
    seen_sessions = 0
    trials = 20
    for trial in range(trials):
        ready = str(tmp_path / f"ready{trial}")
        pid = run("spill", root, str(trial), ready)
        t_end = time.monotonic() + 20
        while not os.path.exists(ready):
            assert time.monotonic() < t_end, "writer process did not start"
            time.sleep(0.005)
        # some kills land while the store opens (sweep), most in the middle of spills
        time.sleep(rng.uniform(0.0, 0.6))
        os.kill(pid, 9)
        reap(pid)
        seen_sessions += _check_consistent(root)
    assert seen_sessions > 0  # the trials did commit sessions, not only die early


def test_unwritable_blob_directory_fails_cleanly(tmp_path):
    root = str(tmp_path / "kv")
    with KVStore(root, NS, block_tokens=16, min_free_bytes=0) as s:
        old = crash_tokens("s0", 40)
        assert s.spill("s0", old, [], crash_cache(old)).ok
        # make every fan-out directory unusable: a regular file where a directory was
        # (chmod means nothing to root; ENOTDIR fails for everyone)
        for i in range(256):
            d = os.path.join(s.blobs_dir, f"{i:02x}")
            keep = [f for f in os.listdir(d)]
            if not keep:
                os.rmdir(d)
                with open(d, "w") as f:
                    f.write("not a directory")
        toks = crash_tokens("s1", 100)
        cache = crash_cache(toks)
        before = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
        r = s.spill("s1", toks, [], cache)
        assert not r.ok and "writing blob failed" in r.error and "Not a directory" in r.error
        for layer, (k, v) in zip(cache.layers, before, strict=True):  # the caller's cache is untouched
            assert torch.equal(layer.keys, k) and torch.equal(layer.values, v)
        assert s.sessions() == ["s0"] and s.counters["spill_failures"] == 1
        back = s.restore("s0", old)
        assert back.n_tokens == 40
        v = s.verify()
        assert not v["bad"] and not v["missing"]


def test_directory_under_a_file_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(Exception) as e:
        KVStore(str(blocker / "kv"), NS)
    assert "not usable" in str(e.value)


def test_free_space_floor_refuses_and_keeps_the_cache(tmp_path):
    with KVStore(str(tmp_path / "kv"), NS, block_tokens=16, min_free_bytes=1 << 60) as s:
        toks = crash_tokens("s0", 40)
        cache = crash_cache(toks)
        r = s.spill("s0", toks, [], cache)
        assert not r.ok and "not enough free disk space" in r.error
        assert cache.get_seq_length() == 40 and s.sessions() == []
        assert s.counters["blobs_on_disk"] == 0


def test_disk_full_mid_write(zygote, tmp_path):
    run, reap = zygote
    out = str(tmp_path / "result.json")
    # a 1024-token block is ~200 KiB: its write crosses the 64 KiB per-file limit
    pid = run("full", str(tmp_path / "kv"), str(64 << 10), out)
    reap(pid)
    with open(out) as f:
        res = json.load(f)
    assert res["first_ok"] and not res["second_ok"], res
    assert "File too large" in res["error"] or "No space" in res["error"], res
    assert res["intact"] and res["restored_exact"] and res["sessions"] == ["s0"]
    with KVStore(str(tmp_path / "kv"), NS, block_tokens=1024, min_free_bytes=0) as s:
        v = s.verify()
        assert not v["bad"] and not v["missing"] and not v["refcount_errors"]
        assert s.sessions() == ["s0"] and s.sweep_report["orphans_removed"] == 0
