"""Parley against llama.cpp on this CPU, at equal bytes: prefill and decode tokens/s side by side.

The same random-weight model for both: the language model of Qwen2-VL-2B-Instruct at its
published shape (tests/fixtures/published_configs.py), converted to a bf16 GGUF (the checkpoint's
own dtype) by llama.cpp's `convert_hf_to_gguf.py`, and from that to f32 / f16 / q8_0 / q4_0 by
`llama-quantize`, as GGUF files are usually made. Each pair of formats stores the weights in the
same bytes per weight, give or take the scales:

    Parley fp32 ~ f32, bf16 ~ bf16, fp16 ~ f16, int8 (per-row) ~ q8_0, int4 ~ q4_0 (the same
    blocks of 32 with an fp16 scale), 4bit (NF4, `--formats`) ~ q4_0

Parley's side is its engine (a text turn through `Engine`, prompt-lookup drafts off: llama.cpp has
none), with `dtype` left at auto as a user's would be; llama.cpp's is `llama-bench` (prefill of the
same number of tokens; decode of the same number after that many tokens of context). Rounds
alternate between the two, so load from other processes falls on both alike; each ratio is the
median of its per-round ratios. Then a picture turn (448×336 picture, short question): Parley's
time to first token ÷ `llama-mtmd-cli`'s (picture encoding + prompt evaluation, by its own
timers), with the same model's vision tower converted by `convert_hf_to_gguf.py --mmproj`.

Goals (issues 30 and 38): decode ≥ 1.0 × llama.cpp and prefill ≥ 1.0 × at equal bytes; int4
decode ≥ 1.6 × Parley's int8; picture time to first token ≤ 1.0 × llama-mtmd-cli (reported even
when not met).

llama.cpp is built once from the pinned `llama-cpp-python` sdist into ~/.cache/parley-bench
(tests/bench/_llamacpp.py); where it cannot be built the benchmark prints one line and stops.
`--quick`: 2 text layers and 3 vision blocks at the published widths, a 4096-token vocabulary,
short prompts, int8, int4 and one full-precision format, also the picture turn's: bf16, or fp32 on
a CPU without bf16 units (_common.precision: bf16 runs several times slower there).

    python tests/bench/vs_llamacpp.py [--formats bf16,int8] [--prompts 512,2048] [--new 128]
                                      [--rounds 3] [--threads 2] [--no-picture] [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from _common import parse_args, precision, ratio_line, same_length_text, workdir
from _llamacpp import LLAMA_CPP_PYTHON, NO_REPACK, PEER_QUICK, PEER_SHAPE, LlamaCpp, Unavailable, ensure

SHAPE = PEER_SHAPE
QUICK = PEER_QUICK
# Parley's weights -> llama.cpp's type: the bf16 conversion itself, or `llama-quantize`d from it.
# One conversion, not one a type: llama.cpp's Python converter took about 5 s a file at the quick
# shape on the AVX2-only EPYC (the quantizer well under one), minutes at the full shape.
GGUF = {"fp32": "f32", "bf16": "bf16", "fp16": "f16", "int8": "q8_0", "int4": "q4_0", "4bit": "q4_0"}
SOURCE = "bf16"
OPENING = "Please read these words:"
QUESTION = "What is in this picture?"


def cpu_flags() -> str:
    """The CPU's model name and the lscpu flags that decide these kernels' speed."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return "lscpu unavailable"
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    keep = [f for f in flags if f.startswith(("avx", "amx", "fma", "f16c"))]
    return f"{fields.get('Model name', '?').strip()}, {fields.get('CPU(s)', '?').strip()} CPUs; {' '.join(keep)}"


@dataclass
class Side:
    prefill: list[float] = field(default_factory=list)  # tokens/s per round
    decode: list[float] = field(default_factory=list)


def parley_turn(engine, cid: str, text: str, new: int) -> tuple[float, float, int]:
    from engine.protocol.events import Message
    from tests.helpers.engine_helpers import ask, expect_done

    s = expect_done(ask(engine, cid, [Message("user", text)], new)).stats
    if s.generated_tokens < new:
        raise RuntimeError(f"Parley stopped after {s.generated_tokens} of {new} tokens")
    return s.prefill_tokens / s.prefill_s, (s.generated_tokens - 1) / s.decode_s, s.prompt_tokens


def kernels_used(model) -> str:
    """How Parley ran a format here (its calibration picks per CPU): the language model's dtype,
    its linears' kinds (numba's one-row kernels or torch's), int8's prompt kernel."""
    from collections import Counter

    from engine.model import int8_layers, row_kernels

    kinds = Counter(type(m).__name__ for m in model.get_decoder().modules() if "Linear" in type(m).__name__)
    if "lm_head" in dict(model.named_children()):
        kinds[type(model.lm_head).__name__ + " (head)"] += 1
    int8 = f"; int8 prompts: {int8_layers.layout()}" if "Int8Linear" in kinds else ""
    return f"computes in {model.dtype}; linears {dict(kinds)}; numba paths {row_kernels.layout()}{int8}"


def measure_format(
    llama: LlamaCpp, model_dir, ggufs: dict, fmt: str, prompts: list[int], new: int, rounds: int, threads: int, d
) -> dict[int, tuple[Side, Side, int]]:
    """{prompt length: (Parley, llama.cpp, prompt tokens)} for one format pair, rounds interleaved."""
    from tests.helpers.engine_helpers import open_engine

    gguf = ggufs[fmt]
    engine = open_engine(model_dir, d / "data", weights=fmt, lookup_decoding=False)  # one data folder: measured once
    out = {}
    try:
        loaded = engine.loaded.weights
        if loaded != fmt:
            raise RuntimeError(f"asked Parley for {fmt}, it loaded {loaded}")
        processor = engine.loaded.processor
        parley_turn(engine, "warm-up", OPENING + " one two three", 4)  # one-time kernel set-up
        print(f"  {fmt}: {kernels_used(engine.loaded.model)}", flush=True)
        for n in prompts:
            ours, theirs = Side(), Side()
            for r in range(rounds):
                text, length = same_length_text(processor, n, OPENING, seed=1000 * n + r)
                p, dec, length = parley_turn(engine, f"{fmt}-{n}-{r}", text, new)
                ours.prefill.append(p)
                ours.decode.append(dec)
                theirs.prefill.append(llama.bench(gguf, threads, prompt=length))
                theirs.decode.append(llama.bench(gguf, threads, generate=new, depth=length))
                print(
                    f"  {fmt} {n} round {r + 1}: prefill {p:.1f} vs {theirs.prefill[-1]:.1f} tok/s, "
                    f"decode {dec:.2f} vs {theirs.decode[-1]:.2f} tok/s",
                    flush=True,
                )
            out[n] = (ours, theirs, length)
    finally:
        engine.shutdown()
    return out


def picture_ttft(
    llama: LlamaCpp, model_dir, fmt: str, gguf, mmproj, rounds: int, threads: int, size: tuple[int, int], d
):
    """(Parley's, llama-mtmd-cli's) seconds to the first token of a new-picture turn, per round;
    a new picture every round (no cache can answer it), the encoder already loaded on both sides.
    Parley in weights `fmt`, llama.cpp's language model `gguf` in the same bytes."""
    from engine.protocol.events import Message
    from tests.fixtures.pictures import make_picture, pics
    from tests.helpers.engine_helpers import ask, expect_done, open_engine

    engine = open_engine(model_dir, d / "data", weights=fmt, lookup_decoding=False, elastic=True, elastic_idle_s=86400)
    ours, theirs = [], []
    try:
        warm = make_picture(d / "warm.png", 999, size=size)
        expect_done(ask(engine, "warm", [Message("user", QUESTION, pics(warm))], 1))
        for r in range(rounds):
            pic = make_picture(d / f"pic{r}.png", r, size=size)
            s = expect_done(ask(engine, f"picture-{r}", [Message("user", QUESTION, pics(pic))], 1)).stats
            if s.encoder_loads or not s.pictures_encoded:
                raise RuntimeError("the picture turn did not encode with a resident encoder")
            ours.append(s.first_token_s)
            theirs.append(llama.picture_first_token(gguf, mmproj, pic, QUESTION, threads))
            print(f"  picture round {r + 1}: first token {ours[-1]:.2f} s vs {theirs[-1]:.2f} s", flush=True)
    finally:
        engine.shutdown()
    return ours, theirs


def auto_pick(model_dir, data_dir) -> tuple[str, str]:
    """The full-precision format `auto` loads here (fastest measured by the engine's own
    calibration at load, engine/model/calibrate.py) and why; ("", why not) when unmeasured."""
    import json

    from engine.model import speed
    from engine.model.weights import fastest_first

    measured = speed.read(data_dir, speed.LayerShape.of_config(json.loads((model_dir / "config.json").read_text())))
    if not measured:
        return "", "the engine measured no format speeds for this shape (a model below calibrate.MIN_PARAMS?)"
    order, why = fastest_first(measured, ["fp32", "bf16"])
    return order[0], why


def paired(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--formats",
        default="bf16,fp32,fp16,int8,int4",
        help=f"Parley weights compared with llama.cpp's equal-bytes type ({', '.join(GGUF)})",
    )
    ap.add_argument("--prompts", default="512,2048", help="prompt lengths in tokens, comma-separated")
    ap.add_argument("--new", type=int, default=128, help="tokens decoded per turn")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per format and prompt")
    ap.add_argument("--threads", type=int, default=0, help="llama.cpp threads (default: torch's, i.e. Parley's)")
    ap.add_argument("--picture", default="448x336", help="picture size of the time-to-first-token turn")
    ap.add_argument("--no-picture", action="store_true", help="skip the picture turn")
    ap.add_argument("--keep-gguf", action="store_true", help="keep the converted GGUF files (next to the model)")
    full = precision(True)["weights"]  # in --quick: what this CPU runs fast
    args = parse_args(
        ap, {"formats": f"{full},int8,int4", "prompts": "64", "new": 16, "rounds": 2, "picture": "224x168"}
    )
    pic_fmt = precision(args.quick)["weights"]
    try:
        llama = ensure(
            build=os.environ.get("PARLEY_BENCH_NO_BUILD") != "1",
            need=("llama-bench", "llama-mtmd-cli", "llama-quantize"),
        )
    except Unavailable as exc:
        print(f"skipped: {exc}")
        return
    import torch

    from tests.fixtures.published_configs import build_published

    threads = args.threads or torch.get_num_threads()
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    unknown = [f for f in formats if f not in GGUF]
    if unknown:
        raise SystemExit(f"unknown format(s) {unknown}; choose from {', '.join(GGUF)}")
    prompts = [int(p) for p in args.prompts.split(",")]
    t0 = time.perf_counter()
    model_dir = build_published(SHAPE, **(QUICK if args.quick else {}))
    gdir = model_dir.parent / f"{model_dir.name}-gguf-{LLAMA_CPP_PYTHON}"
    d = workdir("vs-llamacpp")
    ggufs = {}
    results = {}
    try:
        lm_file = lambda fmt: gdir / f"lm-{GGUF[fmt]}.gguf"  # noqa: E731
        source = llama.convert(model_dir, SOURCE, gdir / f"lm-{SOURCE}.gguf")

        def gguf(fmt: str) -> Path:
            return source if GGUF[fmt] == SOURCE else llama.quantize(source, GGUF[fmt], lm_file(fmt))

        for fmt in formats:
            ggufs[fmt] = gguf(fmt)
            results[fmt] = measure_format(llama, model_dir, ggufs, fmt, prompts, args.new, args.rounds, threads, d)
            if not args.keep_gguf and ggufs[fmt] not in (source, lm_file(pic_fmt)):
                ggufs[fmt].unlink(missing_ok=True)  # GBs each at full size; the source and the picture turn's stay
        auto = auto_pick(model_dir, d / "data")
        pic = None
        if not args.no_picture:
            size = tuple(int(x) for x in args.picture.split("x"))
            lm = ggufs.get(pic_fmt) or gguf(pic_fmt)
            mmproj = llama.convert(model_dir, "f16", gdir / "mmproj-f16.gguf", mmproj=True)
            pic = picture_ttft(llama, model_dir, pic_fmt, lm, mmproj, args.rounds, threads, size, d)
    finally:
        if not args.keep_gguf:
            shutil.rmtree(gdir, ignore_errors=True)

    shape = (
        "quick: 2 text layers, 3 vision blocks, vocabulary 4096" if args.quick else "28 text layers, 32 vision blocks"
    )
    print(
        f"{SHAPE} shape ({shape}), random weights; llama.cpp from llama-cpp-python {LLAMA_CPP_PYTHON} "
        f"({llama.info.get('commit', '?')}); {threads} threads both; {args.new} new tokens; "
        f"{args.rounds} interleaved rounds; {time.perf_counter() - t0:.0f} s"
    )
    print(f"CPU: {cpu_flags()}")
    for line in NO_REPACK.values():
        print(line)
    print(
        f"{'Parley vs llama.cpp':>20} {'prompt':>6} | {'prefill tok/s':>21} {'ratio':>6} | "
        f"{'decode tok/s':>19} {'ratio':>6}"
    )
    for fmt, by_len in results.items():
        for ours, theirs, length in by_len.values():
            pr, dr = paired(ours.prefill, theirs.prefill), paired(ours.decode, theirs.decode)
            print(
                f"{fmt + ' vs ' + GGUF[fmt]:>20} {length:>6} | {statistics.median(ours.prefill):9.1f} / "
                f"{statistics.median(theirs.prefill):9.1f} {pr:6.2f} | {statistics.median(ours.decode):8.2f} / "
                f"{statistics.median(theirs.decode):8.2f} {dr:6.2f}"
            )
    for fmt, by_len in results.items():
        for ours, theirs, length in by_len.values():
            label = f"{fmt} vs {GGUF[fmt]}, {length}-token prompt"
            print(
                ratio_line(
                    f"decode tok/s Parley / llama.cpp, {label}", paired(ours.decode, theirs.decode), at_least=1.0
                )
            )
            print(
                ratio_line(
                    f"prefill tok/s Parley / llama.cpp, {label}", paired(ours.prefill, theirs.prefill), at_least=1.0
                )
            )
    if "int8" in results and "bf16" in results:
        for n in prompts:  # blocks run one after the other: llama.cpp's same-block rate corrects for load drift
            i8, b = results["int8"][n], results["bf16"][n]
            own = statistics.median(i8[0].prefill) / statistics.median(b[0].prefill)
            print(
                ratio_line(
                    f"prefill tok/s Parley int8 / Parley bf16, {b[2]}-token prompt",
                    own,
                    at_least=0.9,
                    note="format blocks run one after the other",
                )
            )
    if "int4" in results and "int8" in results:
        for n in prompts:
            i4, i8 = results["int4"][n], results["int8"][n]
            print(
                ratio_line(
                    f"decode tok/s Parley int4 / Parley int8, {i8[2]}-token prompt",
                    statistics.median(i4[0].decode) / statistics.median(i8[0].decode),
                    at_least=1.6,
                    note="format blocks run one after the other",
                )
            )
    pick, why = auto
    fulls = {f: r for f, r in results.items() if f in ("fp32", "bf16", "fp16")}
    if pick and pick in fulls and len(fulls) > 1:
        for kind in ("decode", "prefill"):
            rate = {f: statistics.median(getattr(by_len[prompts[0]][0], kind)) for f, by_len in fulls.items()}
            best = max(rate, key=rate.get)
            print(
                ratio_line(
                    f"{kind} tok/s of auto's pick ({pick}) / fastest measured ({best}), {prompts[0]}-token prompt",
                    rate[pick] / rate[best],
                    at_least=0.95,
                    note="format blocks run one after the other",
                )
            )
    else:
        print(f"auto's pick: {pick or 'none'} ({why}); measure it with another full-precision format for the goal line")
    if pic is not None:
        ours, theirs = pic
        print(
            f"picture turn {args.picture}: Parley first token {statistics.median(ours):.2f} s, "
            f"llama-mtmd-cli {statistics.median(theirs):.2f} s"
        )
        print(
            ratio_line(
                f"picture turn time to first token Parley / llama-mtmd-cli "
                f"({args.picture}, {pic_fmt} vs {GGUF[pic_fmt]} + f16 mmproj)",
                paired(ours, theirs),
                at_most=1.0,
            )
        )


if __name__ == "__main__":
    main()
