"""Shared bits for the benchmarks (run as scripts: `python tests/bench/NAME.py [--quick]`)."""

from __future__ import annotations

import argparse
import atexit
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import engine  # noqa: E402, F401  # before torch, as in the app: it sets how long torch's OpenMP threads spin


def cpu_flags() -> set[str]:
    """This CPU's flags as lscpu names them (Linux; empty elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def precision(quick: bool) -> dict[str, str]:
    """dtype and weights for a benchmark whose subject is not the weight format: bf16, the
    precision its figures are given in; in --quick on a CPU without bf16 units, fp32 (bf16 runs
    3.5-6.5x slower there). Both named, so a fresh data folder neither times every weight format
    (calibrate.py: 20-30 s at these shapes) nor compiles numba's kernels (8-12 s) first."""
    import torch

    # torch's own kernels capped below AVX-512 (ATEN_CPU_CAPABILITY=avx2, how an AVX2-only CPU is
    # simulated on a newer one) compute bf16 as slowly as a CPU without those units
    no_bf16_units = not cpu_flags() & {"avx512_bf16", "amx_bf16"}
    if quick and (no_bf16_units or not torch.backends.cpu.get_cpu_capability().startswith("AVX512")):
        return {"dtype": "float32", "weights": "fp32"}
    return {"dtype": "bfloat16", "weights": "bf16"}


def workdir(name: str) -> Path:
    """A scratch folder for this run, removed when the benchmark exits (its end, an error, a
    SIGTERM that unwinds; a SIGKILL leaves it). Left behind they filled a CI machine's disk: one
    full-size pass over every benchmark wrote 20 GB into the temporary folder."""
    d = Path(tempfile.mkdtemp(prefix=f"parley-bench-{name}-"))
    atexit.register(shutil.rmtree, d, ignore_errors=True)
    return d


def parse_args(parser: argparse.ArgumentParser, quick: dict) -> argparse.Namespace:
    """Add `--quick` to the benchmark's parser and parse. Quick mode swaps in the small sizes in
    `quick` (seconds, same code path; the test suite runs it) for every option left at its
    default, so `--quick --reps 5` still takes the explicit 5."""
    parser.add_argument(
        "--quick", action="store_true", help="small sizes, a few seconds: checks the benchmark runs, not the goal"
    )
    args = parser.parse_args()
    if args.quick:
        for name, value in quick.items():
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    return args


def distinct_words(tokenizer, count: int, seed: int = 0) -> list[str]:
    """`count` different words in a seeded random order: filler text that never repeats itself,
    so prompt-lookup drafting or prefix caching cannot make a turn over it faster than a real
    prompt's. The words are the tokenizer's own (letters only, decoded from one token each);
    a small vocabulary is stretched with two-word compounds, still each used once."""
    import random

    rng = random.Random(seed)
    words, seen = [], set()
    for token_id in rng.sample(range(len(tokenizer)), len(tokenizer)):
        word = tokenizer.decode([token_id]).strip()
        if len(word) >= 2 and word.isascii() and word.isalpha() and word not in seen:
            seen.add(word)
            words.append(word)
            if len(words) == count:
                return words
    singles = list(words)
    if len(singles) < 2:
        raise ValueError(f"the tokenizer has only {len(singles)} words: no filler can be made from it")
    while len(words) < count:
        compound = "".join(rng.sample(singles, 2))
        if compound not in seen:
            seen.add(compound)
            words.append(compound)
    return words


def same_length_text(processor, n_tokens: int, opening: str, seed: int = 0) -> tuple[str, int]:
    """`opening` and filler words whose rendered prompt (one user message, counted by the model's
    own processor) is the shortest at least `n_tokens` long: (text, its prompt tokens). The filler
    never repeats a word: a repeated one would let prompt-lookup drafts (or any n-gram cache) speed
    up a turn over it; `seed` gives another filler of the same length."""
    from engine.local.prompt import render
    from engine.protocol.events import Message

    words = distinct_words(processor.tokenizer, n_tokens, seed)

    def made(k: int) -> tuple[str, int]:
        text = " ".join([opening, *words[:k]])
        return text, len(processor.tokenizer(render(processor, [Message("user", text)], None))["input_ids"])

    lo, hi = 0, n_tokens  # every word is at least one token: n_tokens words always reach it
    while lo < hi:  # the fewest words that reach n_tokens (bisection: a long prompt is rendered ~11 times)
        mid = (lo + hi) // 2
        if made(mid)[1] >= n_tokens:
            hi = mid
        else:
            lo = mid + 1
    return made(lo)


def ratio_line(
    label: str,
    value: float,
    *,
    at_most: float | None = None,
    at_least: float | None = None,
    also: tuple[str, bool] | None = None,
    unit: str = "",
    note: str = "",
    digits: int = 3,
) -> str:
    """`label: value  (goal ≤ X: yes)`; `also` adds a second condition the verdict needs
    (e.g. ("0 encoder loads", loads == 0)). Without a bound the line carries `note` instead
    and no verdict: a figure shown for comparison, not a goal."""
    shown = f"{value:.{digits}f}{' ' + unit if unit else ''}"
    if at_most is None and at_least is None:
        return f"{label}: {shown}" + (f"  ({note})" if note else "")
    bounds, met = [], True
    if at_least is not None:
        bounds.append(f"≥ {at_least:g}{' ' + unit if unit else ''}")
        met = met and value >= at_least
    if at_most is not None:
        bounds.append(f"≤ {at_most:g}{' ' + unit if unit else ''}")
        met = met and value <= at_most
    goal = " and ".join(bounds)
    if also is not None:
        goal += f" and {also[0]}"
        met = met and also[1]
    return f"{label}: {shown}  (goal {goal}: {'yes' if met else 'no'})" + (f"  [{note}]" if note else "")


def build_big_tower_model(folder: Path, quick: bool = False) -> Path:
    """LLaVA with an ~86M-parameter CLIP tower (224 px, 256 picture tokens) and a small
    6-layer language model: loading and running the encoder is clearly visible.
    `quick`: the same layout at a few million parameters (112 px, 64 picture tokens)."""
    from tests.fixtures.tiny_models import build_tiny_model

    if quick:
        return build_tiny_model(
            "llava",
            folder,
            image_size=112,
            patch_size=14,
            vision={"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4},
            text={
                "hidden_size": 128,
                "intermediate_size": 352,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
            },
        )
    return build_tiny_model(
        "llava",
        folder,
        image_size=224,
        patch_size=14,
        vision={"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12},
        text={
            "hidden_size": 512,
            "intermediate_size": 1408,
            "num_hidden_layers": 6,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
        },
    )
