"""Time to first token when a conversation resumes from the SSD store ÷ when it re-prefills.

An ~8K-token conversation on a random-weight model shaped like a 0.5B LLM (24 layers, 2 KV
heads × 64, fp32 on CPU): turn 1 prefills it; spill-now writes it to the store; the follow-up
turn restores it and prefills only the new text. The re-prefill side is the same follow-up
in an engine whose store is empty. Goal ≤ 0.05. Store-side read throughput is in
restore_throughput.py.
"""
from __future__ import annotations

import threading
import time

from _common import ratio_line, workdir

from engine.events import Message, SpillState
from tests.engine_helpers import ask, expect_done, open_engine
from tests.fixtures.tiny_models import build_tiny_model

TARGET_TOKENS = 8192


def spill(engine, cid):
    done = threading.Event()
    engine.add_listener(lambda e: done.set() if isinstance(e, SpillState) and e.state in ("spilled", "failed") else None)
    engine.spill_now(cid)
    assert done.wait(600)


def main() -> None:
    d = workdir("restore")
    model_dir = build_tiny_model("llava", d / "model", text={
        "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
        "num_attention_heads": 14, "num_key_value_heads": 2,
    })
    words = ("the quick brown fox jumps over the lazy dog while a red circle rolls past a blue "
             "square and a green triangle watches quietly from the corner of the picture ").split()
    text = " ".join(words[i % len(words)] for i in range(int(TARGET_TOKENS * 0.61)))
    opening = [Message("user", text)]

    engine = open_engine(model_dir, d / "data", spill_idle_s=3600)
    try:
        t0 = time.perf_counter()
        first = expect_done(ask(engine, "c", opening, 1))
        print(f"conversation: {first.stats['prompt_tokens']} tokens, first prefill {time.perf_counter() - t0:.1f} s")
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
    ttft_resume = s["restore_s"] + s["first_token_s"]
    ttft_fresh = f["first_token_s"]
    kv_bytes = 2 * 24 * 2 * 64 * 4 * s["restored_tokens"]
    print(f"resume: restored {s['restored_tokens']} tokens ({kv_bytes / 2**20:.0f} MiB) in {s['restore_s'] * 1000:.0f} ms, "
          f"prefilled {s['prefill_tokens']} tokens; TTFT {ttft_resume * 1000:.0f} ms")
    print(f"re-prefill: {f['prefill_tokens']} tokens; TTFT {ttft_fresh * 1000:.0f} ms")
    print(ratio_line("TTFT resume from SSD / TTFT re-prefill", ttft_resume / ttft_fresh, "<= 0.05"))


if __name__ == "__main__":
    main()
