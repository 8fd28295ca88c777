"""What the image-cache gate saves at the published Qwen2-VL-2B shape (bf16 on CPU: a 1.5B
language model and a 675M-parameter vision tower), measured side by side in one run.

- cached-picture turn with the encoder unloaded ÷ text-only turn of the same prompt length
  (goal ≤ 1.05 with 0 encoder loads);
- the same picture turn with the gate off (no feature cache: the encoder loads and encodes for
  every picture turn, as a client without the gate would) ÷ text-only;
- what a new picture costs: encoder load + encode seconds.
Every turn runs in a fresh conversation (no KV prefix to reuse, as when a client re-sends the
whole chat), and the encoder is unloaded before each, as after an idle period. The two engines
run one after the other, never both in memory.

    python tests/bench/image_gate_real.py [--repeats 3] [--picture 448x336] [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from _common import parse_args, precision, ratio_line, same_length_text, workdir

from engine.protocol.events import Message
from engine.protocol.turn_stats import LocalTurnStats
from tests.fixtures.pictures import make_picture, pics
from tests.fixtures.published_configs import build_published, parameter_count, spec_for
from tests.helpers.engine_helpers import ask, expect_done, open_engine

SHAPE = "Qwen2-VL-2B-Instruct"
QUICK = {"layers": 2, "vision_layers": 2, "vocab_size": 4096}
NEW = 16
QUESTION = "What is in this picture?"


def turn(engine, cid, messages) -> tuple[float, LocalTurnStats]:
    t0 = time.perf_counter()
    done = expect_done(ask(engine, cid, messages, NEW))
    return time.perf_counter() - t0, done.stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--picture", default="448x336", help="picture size WxH (Qwen2-VL: one token per 28x28 px)")
    ap.add_argument("--json", default=None, help="write the per-turn series here (for the report's charts)")
    args = parse_args(ap, quick={"repeats": 1, "picture": "320x240"})
    reduce = QUICK if args.quick else {}
    spec = spec_for(SHAPE, **reduce)
    model_dir = build_published(SHAPE, **reduce)
    vision_params = parameter_count(spec)[1]
    d = workdir("gate-real")
    w, h = (int(x) for x in args.picture.split("x"))
    pic = make_picture(d / "p.png", 1, size=(w, h))
    ask_pic = [Message("user", QUESTION, pics(pic))]
    series = {"shape": SHAPE, "quick": bool(args.quick), "gated": [], "gate_off": [], "text_only": []}

    gated = open_engine(model_dir, d / "data-gated", **precision(args.quick), elastic=True, elastic_idle_s=86400)
    try:
        turn(gated, "warm-up", [Message("user", "Hello there.")])  # one-time kernel set-up
        gated.unload_encoder()
        t_new, s_new = turn(gated, "new", ask_pic)
        series["gated"].append(
            {"turn": "new picture", "s": t_new, "encoder_load_s": s_new.encoder_load_s, "encode_s": s_new.encode_s}
        )
        n_prompt = s_new.prompt_tokens
        text, text_len = same_length_text(gated.loaded.processor, n_prompt, QUESTION)
        cached, textonly, loads = [], [], 0
        for r in range(args.repeats):
            gated.unload_encoder()
            t, s = turn(gated, f"hit{r}", ask_pic)
            assert s.encoder_resident is False and s.image_cache_hits == 1, s
            loads += s.encoder_loads
            cached.append(t)
            series["gated"].append({"turn": f"cached {r + 1}", "s": t, "encoder_load_s": 0.0, "encode_s": 0.0})
            t, s = turn(gated, f"txt{r}", [Message("user", text)])
            textonly.append(t)
            series["text_only"].append({"turn": f"text {r + 1}", "s": t})
    finally:
        gated.shutdown()
    del gated

    ungated = open_engine(
        model_dir,
        d / "data-ungated",
        **precision(args.quick),
        elastic=True,
        elastic_idle_s=86400,
        image_cache_entries=0,
        image_cache_disk_bytes=0,
    )
    nogate = []
    try:
        turn(ungated, "warm-up", [Message("user", "Hello there.")])
        for r in range(args.repeats + 1):
            ungated.unload_encoder()
            t, s = turn(ungated, f"ng{r}", ask_pic)
            series["gate_off"].append(
                {
                    "turn": "new picture" if r == 0 else f"again {r}",
                    "s": t,
                    "encoder_load_s": s.encoder_load_s,
                    "encode_s": s.encode_s,
                }
            )
            if r:
                nogate.append(t)
    finally:
        ungated.shutdown()

    c, tx, ng = statistics.median(cached), statistics.median(textonly), statistics.median(nogate)
    t = spec["text"]
    print(
        f"shape {SHAPE}{' (quick: ' + str(reduce) + ')' if reduce else ''}: {t['num_hidden_layers']}-layer "
        f"{t['hidden_size']}-wide LM, vision tower {vision_params / 1e6:.0f}M parameters, bf16 on CPU"
    )
    print(
        f"picture {w}x{h}: prompt {n_prompt} tokens, text-only prompt {text_len} tokens; {NEW} new tokens; "
        f"medians of {args.repeats}"
    )
    print(
        f"text-only turn {tx:.2f} s | cached picture, encoder unloaded {c:.2f} s ({loads} encoder loads) | "
        f"gate off {ng:.2f} s"
    )
    print(
        ratio_line("cached-picture turn / text-only turn", c / tx, at_most=1.05, also=("0 encoder loads", loads == 0))
    )
    print(ratio_line("gate-off picture turn / text-only turn", ng / tx, note="for comparison: what the gate saves"))
    print(ratio_line("new picture: encoder load", s_new.encoder_load_s, unit="s", digits=2))
    print(
        ratio_line(
            "new picture: encode",
            s_new.encode_s,
            unit="s",
            digits=2,
            note=f"picture {w}x{h}, {vision_params / 1e6:.0f}M-parameter tower",
        )
    )
    print(ratio_line("new-picture turn", t_new, unit="s", digits=2))
    print(ratio_line("cached-picture turn", c, unit="s", digits=2))
    print(ratio_line("text-only turn", tx, unit="s", digits=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(series, f, indent=1)


if __name__ == "__main__":
    main()
