"""Time to first token when a conversation resumes from the SSD store ÷ when it re-prefills.

An ~8K-token conversation on a random-weight model shaped like a 0.5B LLM (24 layers, 2 KV
heads × 64, fp32 on CPU): turn 1 prefills it; spill-now writes it to the store; the follow-up
turn restores it and prefills only the new text. The re-prefill side is the same follow-up
in an engine whose store is empty. Goal ≤ 0.05. Store-side read throughput is in
restore_throughput.py.

    python tests/bench/restore_vs_prefill.py [--tokens 8192] [--quick]
"""

from __future__ import annotations

import argparse
import threading
import time

from _common import parse_args, ratio_line, workdir

from engine.protocol.events import Message, SpillState
from tests.fixtures.tiny_models import build_tiny_model
from tests.helpers.engine_helpers import ask, expect_done, open_engine

# The full model is shaped like a 0.5B LLM; quick mode keeps its KV layout (2 KV heads × 64)
# with fewer, narrower layers.
FULL_TEXT = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
}
QUICK_TEXT = {
    "hidden_size": 256,
    "intermediate_size": 704,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def spill(engine, cid):
    done = threading.Event()
    engine.add_listener(
        lambda e: done.set() if isinstance(e, SpillState) and e.state in ("spilled", "failed") else None
    )
    engine.spill_now(cid)
    assert done.wait(600)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=8192, help="conversation length to aim for")
    args = parse_args(ap, quick={"tokens": 2048})
    shape = QUICK_TEXT if args.quick else FULL_TEXT
    d = workdir("restore")
    # a context with room for the conversation and its follow-up (the tiny default is 4096)
    context = 1 << (2 * args.tokens).bit_length()
    model_dir = build_tiny_model("llava", d / "model", text={**shape, "max_position_embeddings": context})
    words = (
        "the quick brown fox jumps over the lazy dog while a red circle rolls past a blue "
        "square and a green triangle watches quietly from the corner of the picture "
    ).split()
    text = " ".join(words[i % len(words)] for i in range(int(args.tokens * 0.61)))
    opening = [Message("user", text)]

    engine = open_engine(model_dir, d / "data", spill_idle_s=3600)
    try:
        t0 = time.perf_counter()
        first = expect_done(ask(engine, "c", opening, 1))
        print(f"conversation: {first.stats.prompt_tokens} tokens, first prefill {time.perf_counter() - t0:.1f} s")
        spill(engine, "c")
        follow = opening + [Message("assistant", first.reply), Message("user", "Summarise that in one line.")]
        resumed = expect_done(ask(engine, "c", follow, 1))
    finally:
        engine.shutdown()
    fresh_engine = open_engine(model_dir, d / "data-empty", spill_idle_s=3600)
    try:
        fresh = expect_done(ask(fresh_engine, "c", follow, 1))
    finally:
        fresh_engine.shutdown()
    assert resumed.token_ids == fresh.token_ids
    s, f = resumed.stats, fresh.stats
    ttft_resume = s.restore_s + s.first_token_s
    ttft_fresh = f.first_token_s
    kv_heads, head_dim = shape["num_key_value_heads"], shape["hidden_size"] // shape["num_attention_heads"]
    kv_bytes = 2 * shape["num_hidden_layers"] * kv_heads * head_dim * 4 * s.restored_tokens
    print(
        f"resume: restored {s.restored_tokens} tokens ({kv_bytes / 2**20:.0f} MiB) in {s.restore_s * 1000:.0f} ms, "
        f"prefilled {s.prefill_tokens} tokens; TTFT {ttft_resume * 1000:.0f} ms"
    )
    print(f"re-prefill: {f.prefill_tokens} tokens; TTFT {ttft_fresh * 1000:.0f} ms")
    print(ratio_line("TTFT resume from SSD / TTFT re-prefill", ttft_resume / ttft_fresh, at_most=0.05))


if __name__ == "__main__":
    main()
