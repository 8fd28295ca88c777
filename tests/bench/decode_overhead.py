"""Engine decode tokens/s ÷ model.generate tokens/s, same ~100M-parameter model and prompt.

Both decode greedily from the same prompt; generate's decode rate is taken from the difference
of two runs (N+1 and 1 new tokens) so its prefill cancels out, the engine's from its decode_s.

    python tests/bench/decode_overhead.py [--tokens 64] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import parse_args, ratio_line, workdir

# _common first: importing the engine sets how long torch's OpenMP threads spin, before torch loads
# isort: split
import torch

from engine.protocol.events import Message
from tests.fixtures.pictures import make_picture, pics
from tests.fixtures.tiny_models import build_tiny_model
from tests.helpers.engine_helpers import Reference, ask, open_engine

FULL_TEXT = {
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
}
QUICK_TEXT = {
    "hidden_size": 256,
    "intermediate_size": 704,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per turn")
    ap.add_argument("--repeats", type=int, default=3)
    args = parse_args(ap, quick={"tokens": 24, "repeats": 2})
    N = args.tokens
    torch.manual_seed(0)
    d = workdir("decode")
    model_dir = build_tiny_model("llava", d / "model", text=QUICK_TEXT if args.quick else FULL_TEXT)
    pic = make_picture(d / "p.png", 1)
    ref = Reference(model_dir)
    n_params = sum(p.numel() for p in ref.loaded.model.parameters())
    messages = [Message("user", "Describe this picture in detail, please.", pics(pic))]
    ids, inputs = ref.prompt_ids(messages)

    def gen_time(n: int) -> float:
        t0 = time.perf_counter()
        with torch.inference_mode():
            ref.loaded.model.generate(**inputs, do_sample=False, max_new_tokens=n, min_new_tokens=n)
        return time.perf_counter() - t0

    engine = open_engine(model_dir, d / "data")
    gen_rates, eng_rates = [], []
    try:
        gen_time(4)  # warm-up both paths
        ask(engine, "warm", messages, 4)
        for r in range(args.repeats):
            gen_rates.append((N - 1) / (gen_time(N) - gen_time(1)))
            done = ask(engine, f"c{r}", messages, N)
            eng_rates.append((done.stats.generated_tokens - 1) / done.stats.decode_s)
    finally:
        engine.shutdown()
    g, e = statistics.median(gen_rates), statistics.median(eng_rates)
    print(
        f"model: {n_params / 1e6:.0f}M parameters, prompt {len(ids)} tokens, {N} new tokens, "
        f"CPU threads {torch.get_num_threads()}"
    )
    print(f"model.generate decode: {g:.1f} tok/s   engine decode: {e:.1f} tok/s")
    print(ratio_line("engine / generate decode tokens/s", e / g, at_least=0.95))


if __name__ == "__main__":
    main()
