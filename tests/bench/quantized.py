"""int8 (and, on CUDA, 4-bit NF4) language-model weights against bf16, at Qwen2-VL-2B-Instruct's
published shape with random weights (nothing downloaded), loaded through Parley's own load path.

Measured side by side in one run: language-model weight bytes int8 ÷ bf16 (goal <= 0.55), greedy
decode tokens/s int8 ÷ bf16 (goal >= 0.9 on CPU), prefill tokens/s of the 200-token prompt int8 ÷
bf16 (goal >= 0.9: a prompt never goes through a one-row kernel), and the agreement of greedy next-token choices
with bf16 over 200 positions of a fixed prompt (reported). `--quick`: 2 text layers, a 64-token prompt, a
2-block vision tower at the same widths, and a 4096-token vocabulary like the other benchmarks' quick runs.

int8 is torchao's per-row quantization run by engine/model/int8_layers.py: on CPU through torch's
fused `_weight_int8pack_mm` (torchao 0.18's own int8 linear converts the whole weight to bf16 on
every call, a third of bf16's decode speed here), with the tied token embedding / output head
(15% of Qwen2-VL-2B's language model) in int8 too; a prompt through oneDNN's int8 GEMM with
per-row int8 activations where the CPU computes it exactly and faster (VNNI/AMX), else the dense GEMM.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

from _common import ratio_line, workdir

# _common first: importing the engine sets how long torch's OpenMP threads spin, before torch loads
# isort: split
import torch
from transformers import DynamicCache

from engine.device.ledger import model_bytes
from engine.model.load import load_model
from tests.fixtures.tiny_models import build_tiny_model

# Qwen2-VL-2B-Instruct's config.json (text and vision sizes), written down as test data
QWEN2_VL_2B_TEXT = dict(
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "mrope_section": [16, 24, 24], "rope_theta": 1000000.0},
)
QWEN2_VL_2B_VISION = dict(
    depth=32,
    embed_dim=1280,
    hidden_size=1536,
    mlp_ratio=4,
    num_heads=16,
    in_chans=3,
    patch_size=14,
    spatial_merge_size=2,
    temporal_patch_size=2,
)
# the prompt: its positions compared for greedy agreement, and prefilled for speed (quick, full);
# --quick keeps it short: a bf16 output head over 200 positions took 6.5 s a format on an AVX2-only CPU
PROMPT = {True: 64, False: 200}
DECODE = {True: 24, False: 12}  # tokens decoded per speed run (quick, full)
REPEATS = {True: 3, False: 5}  # interleaved rounds (one speed run of each format per round)
# --quick's vocabulary: the published one's output head (151936 x 1536) was 70% of the 2-layer
# language model's weights, and most of the quick run's time in the test suite
VOCAB = {True: 4096, False: QWEN2_VL_2B_TEXT["vocab_size"]}


def build_folder(quick: bool):
    """A loadable folder: the fixture's Qwen2-VL processor and special-token ids, the published
    sizes, random weights saved in bf16."""
    from transformers import AutoModelForImageTextToText, Qwen2VLConfig

    folder = build_tiny_model("qwen2_vl", workdir("quantized") / "model", dtype="bfloat16")
    base = json.loads((folder / "config.json").read_text())
    text = {**base["text_config"], **QWEN2_VL_2B_TEXT}
    vision = {**base["vision_config"], **QWEN2_VL_2B_VISION}
    if quick:
        text["num_hidden_layers"], vision["depth"] = 2, 2
    text["vocab_size"] = VOCAB[quick]
    text.pop("layer_types", None)  # follows num_hidden_layers
    config = Qwen2VLConfig(**{**base, "text_config": text, "vision_config": vision, "tie_word_embeddings": True})
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.bfloat16)
    for f in folder.glob("*.safetensors"):
        f.unlink()
    model.save_pretrained(folder)
    del model
    gc.collect()
    return folder


@torch.inference_mode()
def greedy_choices(loaded, prompt: torch.Tensor) -> torch.Tensor:
    """The greedy next-token choice at every position of the prompt, one forward pass."""
    return loaded.model(input_ids=prompt.to(loaded.device), use_cache=False).logits[0].argmax(-1).cpu()


@torch.inference_mode()
def prefill_rate(loaded, prompt: torch.Tensor) -> float:
    """Prompt tokens/s of one prefill of the whole prompt (one chunk, the last logits only)."""
    t0 = time.perf_counter()
    loaded.model(
        input_ids=prompt.to(loaded.device),
        cache=DynamicCache(config=loaded.model.config),
        use_cache=True,
        logits_to_keep=1,
    ).logits.cpu()
    return prompt.shape[1] / (time.perf_counter() - t0)


@torch.inference_mode()
def decode_rate(loaded, prompt: torch.Tensor, tokens: int) -> float:
    """Greedy decode tokens/s after a 32-token prefill."""
    model = loaded.model
    cache = DynamicCache(config=model.config)
    tok = model(input_ids=prompt[:, :32].to(loaded.device), cache=cache, use_cache=True).logits[:, -1:].argmax(-1)
    if loaded.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(tokens):
        tok = model(input_ids=tok, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)
    tok.cpu()
    return tokens / (time.perf_counter() - t0)


def measure(folder, formats: list[str], prompt: torch.Tensor, device: str, quick: bool) -> dict:
    """All formats loaded side by side and their decode runs interleaved round by round, so
    that load from other processes on a shared CPU falls on every format alike; a format's
    speed ratio is the median of its per-round ratios to bf16."""
    loaded = {f: load_model(folder, device=device, dtype="bfloat16", weights=f) for f in formats}
    runs = {}
    for f, lm in loaded.items():
        lm_bytes, vision = model_bytes(lm)
        runs[f] = {
            "lm_bytes": lm_bytes,
            "vision_bytes": vision,
            "choices": greedy_choices(lm, prompt),
            "format": lm.weights,
            "rates": [],
            "prefill": [],
        }
    for _ in range(REPEATS[quick]):
        for f, lm in loaded.items():
            runs[f]["rates"].append(decode_rate(lm, prompt, DECODE[quick]))
            runs[f]["prefill"].append(prefill_rate(lm, prompt))
    for r in runs.values():
        r["tok_s"] = statistics.median(r["rates"])
        r["speed"] = statistics.median(x / b for x, b in zip(r["rates"], runs["bf16"]["rates"], strict=True))
        r["prefill_speed"] = statistics.median(
            x / b for x, b in zip(r["prefill"], runs["bf16"]["prefill"], strict=True)
        )
    del loaded
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"2 text layers, 2 vision blocks, vocabulary {VOCAB[True]}")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--formats",
        default="",
        help="weights compared with bf16, comma-separated (default int8, and 4bit on CUDA; 4bit also runs on CPU)",
    )
    args = ap.parse_args()
    t0 = time.perf_counter()
    folder = build_folder(args.quick)
    prompt = torch.randint(0, VOCAB[args.quick], (1, PROMPT[args.quick]), generator=torch.Generator().manual_seed(1))
    others = args.formats.split(",") if args.formats else ["int8"] + (["4bit"] if args.device == "cuda" else [])
    formats = ["bf16"] + [f for f in others if f != "bf16"]
    runs = measure(folder, formats, prompt, args.device, args.quick)  # its folder goes at exit (workdir)
    bf = runs["bf16"]
    shape = "28 text layers, 32 vision blocks"
    if args.quick:
        shape = f"quick: 2 text layers, 2 vision blocks, vocabulary {VOCAB[True]}"
    print(
        f"Qwen2-VL-2B-Instruct shape ({shape}), random weights, device {args.device}, "
        f"CPU threads {torch.get_num_threads()}, setup+runs {time.perf_counter() - t0:.0f} s"
    )
    for f, r in runs.items():
        print(
            f"{f:>5}: language model {r['lm_bytes'] / 1e6:9.1f} MB, vision {r['vision_bytes'] / 1e6:7.1f} MB, "
            f"decode {r['tok_s']:.2f} tok/s (rounds: {', '.join(f'{x:.2f}' for x in r['rates'])}), "
            f"prefill {statistics.median(r['prefill']):.1f} tok/s"
        )
        assert r["vision_bytes"] == bf["vision_bytes"], "the vision tower must stay in full precision"
        assert r["format"] == f, f"asked for {f}, loaded {r['format']}"
    for f in formats[1:]:
        r = runs[f]
        agree = float((r["choices"] == bf["choices"]).float().mean())
        size, speed = r["lm_bytes"] / bf["lm_bytes"], r["speed"]
        size_goal = 0.55 if f == "int8" else 0.35
        speed_goal = 0.9
        print(ratio_line(f"weight bytes {f} / bf16", size, at_most=size_goal))
        print(ratio_line(f"decode tok/s {f} / bf16 on {args.device}", speed, at_least=speed_goal))
        print(
            ratio_line(
                f"prefill tok/s {f} / bf16 on {args.device} ({prompt.shape[1]}-token prompt)",
                r["prefill_speed"],
                at_least=0.9,
            )
        )
        print(
            ratio_line(
                f"greedy next-token agreement {f} vs bf16 over {prompt.shape[1]} positions", agree, note="reported"
            )
        )


if __name__ == "__main__":
    main()
