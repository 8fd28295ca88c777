"""Decode tokens/s of the engine (prompt-lookup drafts on) ÷ `model.generate`, greedy, same prompt.

1. A turn that restates an earlier reply: the built-in demo model is asked to describe a
   picture, then asked again; the second reply repeats most of the first (goal >= 1.5).
2. A turn with nothing to repeat: a ~100M-parameter random-weight model describing a picture
   (its replies never repeat the prompt; goal >= 0.97: drafting must cost next to nothing).
generate's decode rate is taken from the difference of two runs (N and 1 new tokens) so its
prefill cancels out; the engine's from its decode_s. The engine without drafts is printed too.
`--quick`: one round, a small random model for the second turn kind.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import parse_args, ratio_line, workdir

# _common first: importing the engine sets how long torch's OpenMP threads spin, before torch loads
# isort: split
import torch

from engine.platform.paths import DEMO_MODEL
from engine.protocol.events import Message
from engine.protocol.turn_stats import LocalTurnStats
from tests.fixtures.pictures import make_picture, pics
from tests.fixtures.tiny_models import build_tiny_model
from tests.helpers.engine_helpers import Reference, ask, expect_done, open_engine


def generate_rate(ref: Reference, messages, n: int) -> float:
    _, inputs = ref.prompt_ids(messages)

    def run(k: int) -> float:
        t0 = time.perf_counter()
        with torch.inference_mode():
            ref.loaded.model.generate(**inputs, do_sample=False, max_new_tokens=k, min_new_tokens=k)
        return time.perf_counter() - t0

    run(2)  # warm-up
    return (n - 1) / (run(n) - run(1))


def engine_rate(engine, cid: str, messages, n: int) -> tuple[float, LocalTurnStats]:
    done = expect_done(ask(engine, cid, messages, n))
    s = done.stats
    return (s.generated_tokens - 1) / s.decode_s, s


def compare(label: str, model_dir, conversation, n: int, repeats: int, d, goal: float) -> None:
    """conversation(engine, cid) -> the messages of the measured turn (earlier turns already run)."""
    ref = Reference(model_dir)
    drafting = open_engine(model_dir, d / f"{label}-on")
    plain = open_engine(model_dir, d / f"{label}-off", lookup_decoding=False)
    gen, on, off, taken = [], [], [], []
    try:
        for r in range(repeats + 1):  # round 0 warms every path up
            messages = conversation(drafting, f"c{r}")
            conversation(plain, f"c{r}")
            e, stats = engine_rate(drafting, f"c{r}", messages, n)
            p, _ = engine_rate(plain, f"c{r}", messages, n)
            g = generate_rate(ref, messages, stats.generated_tokens)
            if r:
                gen.append(g), on.append(e), off.append(p), taken.append(stats.draft_acceptance)
    finally:
        drafting.shutdown()
        plain.shutdown()
    g, e, p = statistics.median(gen), statistics.median(on), statistics.median(off)
    print(
        f"[{label}] generate {g:.1f} tok/s, engine {e:.1f} tok/s with drafts "
        f"({statistics.median(taken):.0%} taken), {p:.1f} tok/s without"
    )
    print(ratio_line(f"{label}: engine (drafts) / generate decode tokens/s", e / g, at_least=goal))
    print(ratio_line(f"{label}: engine (no drafts) / generate decode tokens/s", p / g, note="for comparison"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="measured rounds per turn kind (median)")
    args = parse_args(ap, {"rounds": 1})
    torch.manual_seed(0)
    d = workdir("decode-speed")
    pic = make_picture(d / "p.png", 5, size=(96, 96))
    print(f"CPU threads {torch.get_num_threads()}")

    def restating(engine, cid):
        first = [Message("user", "Describe the picture.", pics(pic))]
        done = expect_done(ask(engine, cid, first, 40))
        return first + [Message("assistant", done.reply), Message("user", "Describe the picture.")]

    compare("restating turn", DEMO_MODEL, restating, 40, args.rounds, d, 1.5)

    text = (
        {
            "hidden_size": 256,
            "intermediate_size": 512,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        }
        if args.quick
        else {
            "hidden_size": 1024,
            "intermediate_size": 2816,
            "num_hidden_layers": 8,
            "num_attention_heads": 16,
            "num_key_value_heads": 4,
        }
    )
    model_dir = build_tiny_model("llava", d / "model", text=text)

    def fresh(engine, cid):
        return [Message("user", "Describe this picture in detail, please.", pics(pic))]

    compare("no repetition", model_dir, fresh, 16 if args.quick else 64, args.rounds, d, 0.97)


if __name__ == "__main__":
    main()
