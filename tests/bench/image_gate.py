"""What the image-cache gate saves, measured side by side in one run.

- cached-picture turn with the encoder unloaded ÷ text-only turn of the same prompt length
  (goal ≤ 1.05, with 0 encoder loads);
- the same picture turn with the gate off (no feature cache, encoder loaded for every picture
  turn, as a client without the gate would) ÷ text-only;
- a new-picture turn, with its load and encode times.
Each turn runs in a fresh conversation so no KV prefix is reused past the template's opening.

    python tests/bench/image_gate.py [--repeats 5] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import build_big_tower_model, parse_args, ratio_line, same_length_text, workdir

from engine.protocol.events import Message
from engine.protocol.turn_stats import LocalTurnStats
from tests.fixtures.pictures import make_picture, pics
from tests.helpers.engine_helpers import ask, expect_done, open_engine

NEW = 16


def turn_s(engine, cid, messages) -> tuple[float, LocalTurnStats]:
    t0 = time.perf_counter()
    done = expect_done(ask(engine, cid, messages, NEW))
    return time.perf_counter() - t0, done.stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = parse_args(ap, quick={"repeats": 2})
    d = workdir("gate")
    model_dir = build_big_tower_model(d / "model", quick=args.quick)
    pic = make_picture(d / "p.png", 1, size=(320, 240))
    question = "What is in this picture?"

    # no prompt-lookup drafts: they speed up whichever reply happens to repeat its prompt, so the two
    # turns would differ by what the (random) model writes, not by what the gate does
    gated = open_engine(model_dir, d / "data-gated", elastic=True, elastic_idle_s=3600, lookup_decoding=False)
    ungated = open_engine(
        model_dir,
        d / "data-ungated",
        elastic=True,
        elastic_idle_s=3600,
        lookup_decoding=False,
        image_cache_entries=0,
        image_cache_disk_bytes=0,
    )
    try:
        vision_params = (
            sum(p.numel() for p in gated.loaded.vision_parameters() if p.numel())
            or gated.gate.residency.weight_bytes() // 4
        )
        # the first picture turn: a miss, so the encoder loads and encodes
        t_new, s_new = turn_s(gated, "new", [Message("user", question, pics(pic))])
        gated.unload_encoder()
        # a text-only prompt of the same token length, of words that never repeat: one word over
        # and over gave prompt-lookup drafts to the text turn only (image_gate_real does the same)
        text, text_len = same_length_text(gated.loaded.processor, s_new.prompt_tokens, question)

        cached, textonly, nogate, loads = [], [], [], 0
        for r in range(args.repeats):
            t, s = turn_s(gated, f"hit{r}", [Message("user", question, pics(pic))])
            cached.append(t)
            loads += s.encoder_loads
            assert s.encoder_resident is False
            textonly.append(turn_s(gated, f"txt{r}", [Message("user", text)])[0])
            ungated.unload_encoder()
            nogate.append(turn_s(ungated, f"ng{r}", [Message("user", question, pics(pic))])[0])
    finally:
        gated.shutdown()
        ungated.shutdown()
    c, tx, ng = statistics.median(cached), statistics.median(textonly), statistics.median(nogate)
    print(
        f"vision tower ≈ {vision_params / 1e6:.0f}M parameters; picture prompt {s_new.prompt_tokens} tokens, "
        f"text-only prompt {text_len} tokens; {NEW} new tokens; medians of {args.repeats}"
    )
    print(
        f"text-only turn {tx * 1000:.1f} ms | cached picture, encoder unloaded {c * 1000:.1f} ms "
        f"({loads} encoder loads) | gate off {ng * 1000:.1f} ms"
    )
    print(
        ratio_line("cached-picture turn / text-only turn", c / tx, at_most=1.05, also=("0 encoder loads", loads == 0))
    )
    print(ratio_line("gate-off picture turn / text-only turn", ng / tx, note="for comparison: what the gate saves"))
    print(
        f"new-picture turn: {t_new * 1000:.1f} ms, of which encoder load {s_new.encoder_load_s * 1000:.1f} ms "
        f"and encode {s_new.encode_s * 1000:.1f} ms"
    )


if __name__ == "__main__":
    main()
