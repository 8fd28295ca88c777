"""A decode step's linears at memory speed: numba's one-row kernels (engine/model/row_kernels.py)
against memory speed and against torch's kernels, at Qwen2-VL-2B's widths, one row, this CPU.

Memory speed is torch summing a 1 GiB tensor, measured in the same run, interleaved with the
kernels. A format's speed is the bytes of its weights over the wall time of one row through
copies of one layer's seven linears (q, k, v, o, gate, up, down) filling WORKING_SET, so they
stream from memory as a real model's do; built through the very modules the engine runs
(calibrate.py's makers), best of the rounds. Goals: fp32, bf16 and int8 stream >= 0.7 of memory
speed, int4 >= 0.5; int4 decodes >= 1.6x int8's tokens/s at equal parameters (it reads 0.56 of
int8's bytes). Also: the first launch compiles the kernels in <= 10 s, a later one reads
them from the cache in <= 0.5 s (fresh processes, a fresh cache folder).
`--quick`: 48 MiB of weights (in the CPU's cache, so the ratios say nothing), one round.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import textwrap
import time

from _common import ROOT, parse_args, ratio_line, workdir

# _common first: importing the engine sets how long torch's OpenMP threads spin, before torch loads
# isort: split
import torch

from engine.model import calibrate, packed_linear, row_kernels
from engine.model.speed import LayerShape

# Qwen2-VL-2B-Instruct's language model widths (config.json)
SHAPE = LayerShape(hidden=1536, intermediate=8960, q_width=1536, kv_width=256, layers=28, vocab=151936)
GOALS = {"fp32": 0.7, "bf16": 0.7, "int8": 0.7, "int4": 0.5}


def memory_speed(t: torch.Tensor) -> float:
    t0 = time.perf_counter()
    t.sum()
    return t.numel() * t.element_size() / (time.perf_counter() - t0) / 1e9


def layer_copies(make, weights, dtype, working_set: int) -> tuple[list[list], int]:
    built = make(weights, dtype)
    first = built()
    size = calibrate._layer_bytes(first)
    copies = [first] + [built() for _ in range(max(1, working_set // size) - 1)]
    return copies, size * len(copies)


def stream_speed(copies, dtype) -> float:
    """GB/s of one row through every linear of every copy (wall time)."""
    xs = [torch.randn(1, m.in_features, dtype=dtype) for m in copies[0]]
    total = sum(calibrate._layer_bytes(layer) for layer in copies)
    with torch.inference_mode():
        t0 = time.perf_counter()
        for layer in copies:
            for m, x in zip(layer, xs, strict=True):
                m(x)
        return total / (time.perf_counter() - t0) / 1e9


def compile_seconds(cache: str) -> float:
    """Seconds a fresh process takes to make the kernels ready (import, compile or cache read, check)."""
    code = textwrap.dedent(
        f"""
        import time
        from engine.model import row_kernels  # torch and the engine imported: their time is not numba's
        t0 = time.perf_counter()
        assert row_kernels.load({cache!r}) is not None, row_kernels.unavailable()
        print(time.perf_counter() - t0)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NUMBA_CACHE_DIR", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _plain(weights, dtype):
    return calibrate._float_layer(weights, dtype, packed=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--working-set-mib", type=int, default=768)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--memory-mib", type=int, default=1024)
    args = parse_args(ap, {"working_set_mib": 48, "rounds": 1, "memory_mib": 64})
    d = workdir("row-kernels")
    first, later = compile_seconds(str(d)), compile_seconds(str(d))
    kernels = row_kernels.load(d)
    if kernels is None:
        print(f"skipped: numba's kernels do not run here ({row_kernels.unavailable()})")
        return
    torch.manual_seed(0)
    weights = [torch.randn(o, i) * 0.02 for o, i in SHAPE.linears]
    working_set = args.working_set_mib << 20
    big = torch.ones((args.memory_mib << 20) // 4)
    # (format, label, maker, compute dtype): numba's kernel first, then torch's as the engine runs them
    f32, bf16 = torch.float32, torch.bfloat16
    runs = {
        "fp32": [("numba", calibrate._row_layer, f32), ("torch", _plain, f32)],
        "bf16": [("numba", calibrate._row_layer, bf16), ("torch", _plain, bf16)],
        "int8": [
            ("numba", calibrate._int8_row_layer, f32),
            ("torch fp32 act.", calibrate._int8_layer, f32),
            ("torch bf16 act.", calibrate._int8_layer, bf16),
        ],
        "int4": [("numba", calibrate._int4_layer, f32)],
    }
    for fmt, dtype in (("fp32", f32), ("bf16", bf16)):
        if packed_linear.available(dtype):
            runs[fmt].append(("torch packed", lambda w, dt: calibrate._float_layer(w, dt, packed=True), dtype))
    speeds: dict[tuple[str, str], float] = {}
    memory: list[float] = []
    for fmt, kinds in runs.items():
        for label, make, dtype in kinds:
            if label == "numba":
                make = (lambda m: lambda w, dt: m(w, dt, kernels=kernels))(make)
            copies, nbytes = layer_copies(make, weights, dtype, working_set)
            stream_speed(copies[:1], dtype)  # first calls set kernels up
            best = 0.0
            for _ in range(args.rounds):  # memory speed interleaved with every format's rounds
                memory.append(memory_speed(big))
                best = max(best, stream_speed(copies, dtype))
            speeds[fmt, label] = best
            print(f"{fmt:5} {label:16} {best:6.2f} GB/s  ({nbytes / (1 << 20):.0f} MiB of weights)")
            del copies
            gc.collect()
    mem = max(memory)
    flags = " ".join(
        f
        for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile", "f16c")
        if f in _cpu_flags()
    )
    print(
        f"memory speed (torch sum of {args.memory_mib} MiB): {mem:.2f} GB/s; threads {torch.get_num_threads()}; {flags};"  # noqa: E501
        f" int4 kernel {row_kernels.int4_path()}, int8 kernel {row_kernels.int8_path()},"
        f" bf16 kernel {row_kernels.bf16_path()}"
    )
    for fmt, goal in GOALS.items():
        numba_speed = speeds[fmt, "numba"]
        print(ratio_line(f"{fmt} decode step streams / memory speed (numba)", numba_speed / mem, at_least=goal))
        torch_best = max((v for (f, label), v in speeds.items() if f == fmt and label != "numba"), default=0.0)
        if torch_best:
            print(
                ratio_line(f"{fmt} numba / torch's fastest one-row kernel", numba_speed / torch_best, note="reported")
            )
    # equal parameters: tokens/s ratio is the ratio of weights streamed per second
    per_weight = {"int8": 1 + 4 / 1536, "int4": 18 / 32}
    int4_vs_int8 = (speeds["int4", "numba"] / per_weight["int4"]) / (speeds["int8", "numba"] / per_weight["int8"])
    print(ratio_line("int4 decode / int8 decode (numba, tokens/s at equal parameters)", int4_vs_int8, at_least=1.6))
    print(ratio_line("first launch: kernels compiled", first, at_most=10, unit="s", digits=2))
    print(ratio_line("later launch: kernels read from the cache", later, at_most=0.5, unit="s", digits=2))


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


if __name__ == "__main__":
    main()
