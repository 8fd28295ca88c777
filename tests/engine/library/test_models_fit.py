"""The fit estimate against hand-computed numbers for two published configs, and the folder check."""

from __future__ import annotations

import math

import pytest

from engine.library.fit import count_params, estimate_fit, kv_bytes_per_token, memory_need, verdict
from engine.library.repo_check import needed_files, problem
from tests.helpers.hub_configs import QWEN2_VL_2B, SMOLVLM_256M

# Qwen2.5-VL-3B-Instruct and llava-1.5-7b-hf (a sparse config: transformers' own config classes
# fill in Llama's and CLIP's defaults)
QWEN25_VL_3B = {
    "model_type": "qwen2_5_vl",
    "hidden_size": 2048,
    "intermediate_size": 11008,
    "num_hidden_layers": 36,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "vision_config": {
        "depth": 32,
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "in_chans": 3,
        "out_hidden_size": 2048,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "hidden_act": "silu",
        "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31],
    },
}
LLAVA_15_7B = {
    "model_type": "llava",
    "image_token_index": 32000,
    "projector_hidden_act": "gelu",
    "text_config": {"model_type": "llama", "vocab_size": 32064, "max_position_embeddings": 4096},
    "vision_config": {
        "model_type": "clip_vision_model",
        "hidden_size": 1024,
        "image_size": 336,
        "intermediate_size": 4096,
        "num_attention_heads": 16,
        "num_hidden_layers": 24,
        "patch_size": 14,
        "projection_dim": 768,
    },
}


def test_qwen2_vl_2b_by_hand():
    # language: embed 151936*1536 + 28 layers * (q 1536*1536+1536, k and v 1536*256+256 each,
    # o 1536*1536, mlp 3*1536*8960, two norms 2*1536) + final norm 1536; lm_head tied
    layer = (1536 * 1536 + 1536) + 2 * (1536 * 256 + 256) + 1536 * 1536 + 3 * 1536 * 8960 + 2 * 1536
    language = 151936 * 1536 + 28 * layer + 1536
    # vision: 32 blocks * (qkv+o 4*1280^2+4*1280, mlp 2*1280*5120+5120+1280, norms 4*1280)
    # + Conv3d 3*2*14*14*1280 + merger (norm 1280, 5120x5120+5120, 5120x1536+1536)
    block = 4 * 1280 * 1280 + 4 * 1280 + 2 * 1280 * 5120 + 5120 + 1280 + 4 * 1280
    vision = 32 * block + 3 * 2 * 14 * 14 * 1280 + 1280 + 5120 * 5120 + 5120 + 5120 * 1536 + 1536
    p = count_params(QWEN2_VL_2B)
    assert (p.language, p.vision) == (language, vision) == (1_543_714_304, 665_270_016)
    assert abs(p.total / 2.21e9 - 1) < 0.01  # the model card's 2.21B
    assert kv_bytes_per_token(QWEN2_VL_2B) == 2 * 28 * 2 * 128 * 2 == 28_672
    need = memory_need(QWEN2_VL_2B, "bfloat16", 8192)
    assert need.total_bytes == 2 * language + 2 * vision + 28_672 * 8192
    q4 = memory_need(QWEN2_VL_2B, "4bit", 8192)  # the vision tower stays 16-bit
    assert q4.total_bytes == language // 2 + 2 * vision + 28_672 * 8192


def test_smolvlm_256m_by_hand():
    layer = 576 * 576 + 2 * 576 * 192 + 576 * 576 + 3 * 576 * 1536 + 2 * 576
    language = 49280 * 576 + 30 * layer + 576 + 49280 * 576  # untied lm_head
    block = 4 * 768 * 768 + 4 * 768 + 2 * 768 * 3072 + 3072 + 768 + 4 * 768
    # patch conv 3*16*16*768 + bias, 32*32 positions, post-norm, connector 768*16 -> 576 (no bias)
    vision = 12 * block + 3 * 16 * 16 * 768 + 768 + 1024 * 768 + 2 * 768 + 768 * 16 * 576
    p = count_params(SMOLVLM_256M)
    assert (p.language, p.vision) == (language, vision)
    assert abs(p.total / 256e6 - 1) < 0.01  # "256M"
    assert kv_bytes_per_token(SMOLVLM_256M, "float32") == 2 * 30 * 3 * 64 * 4


def test_verdict_bands_and_the_line():
    assert verdict(80, 100) == "fits" and verdict(81, 100) == "tight" and verdict(101, 100) == "does not fit"
    fit = estimate_fit(QWEN2_VL_2B, "bfloat16", 4096, device=("cuda:0 (test)", 4 << 30))
    assert fit.verdict == "does not fit"  # (2 * 2_208_984_320 + 28_672 * 4096) / 2**30 = 4.22 GiB on a 4 GiB card
    assert fit.line().startswith("does not fit: needs 4.22 GiB") and "of 4.00 GiB free on cuda:0 (test)" in fit.line()
    assert estimate_fit(SMOLVLM_256M, "bfloat16", 4096, device=("cpu (RAM)", 8 << 30)).verdict == "fits"
    with pytest.raises(ValueError, match="unknown precision"):
        memory_need(SMOLVLM_256M, "int3")


def test_folder_check_before_download():
    files = [
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "consolidated.safetensors",
        "pytorch_model.bin",
        "onnx/model.onnx",
        "tokenizer.json",
        "chat_template.jinja",
        "README.md",
    ]
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    assert needed_files(files, index) == [
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "chat_template.jinja",
    ]
    assert problem(QWEN2_VL_2B, files) is None
    assert problem(
        {"model_type": "llava_next", "architectures": ["LlavaNextForConditionalGeneration"]}, files
    ).startswith("unsupported architecture 'llava_next'")
    assert (
        problem(QWEN2_VL_2B, ["config.json", "pytorch_model.bin", "chat_template.jinja"])
        == "no .safetensors weights (Parley loads safetensors only)"
    )
    no_template = ["config.json", "model.safetensors", "tokenizer_config.json"]
    assert problem(QWEN2_VL_2B, no_template, {"eos_token": "x"}).startswith("no chat template")
    assert problem(QWEN2_VL_2B, no_template, {"chat_template": "{{ m }}"}) is None


def test_two_more_families_match_their_published_counts():
    """Qwen2.5-VL-3B-Instruct (gated vision MLP, RMSNorm) and llava-1.5-7b-hf (a sparse config:
    transformers' own config classes fill in Llama's and CLIP's defaults)."""
    assert abs(count_params(QWEN25_VL_3B).total / 3.75e9 - 1) < 0.01  # "3.75B"
    assert abs(count_params(LLAVA_15_7B).total / 7.06e9 - 1) < 0.01  # "7.06B"
    assert kv_bytes_per_token(LLAVA_15_7B) == 2 * 32 * 32 * 128 * 2  # Llama-2-7B: no grouped KV heads


@pytest.mark.parametrize(
    "repo_id, config",
    [
        ("Qwen/Qwen2-VL-2B-Instruct", QWEN2_VL_2B),
        ("HuggingFaceTB/SmolVLM-256M-Instruct", SMOLVLM_256M),
        ("Qwen/Qwen2.5-VL-3B-Instruct", QWEN25_VL_3B),
        ("llava-hf/llava-1.5-7b-hf", LLAVA_15_7B),
    ],
)
def test_the_catalog_estimate_agrees_with_the_config_estimate(repo_id, config):
    """Offline the Models page sizes catalog models from the catalog's own numbers (published
    parameter counts, KV bytes per token): within 1 % of the estimate from config.json."""
    from engine.library.catalog import load_catalog
    from engine.library.fit import catalog_need

    entry = next(e for e in load_catalog() if e.repo_id == repo_id)
    for precision in ("bfloat16", "float32", "4bit"):
        exact, est = memory_need(config, precision, 8192), catalog_need(entry, precision, 8192)
        assert est.kv_bytes_per_token == exact.kv_bytes_per_token
        assert abs(est.total_bytes / exact.total_bytes - 1) < 0.01, (precision, est, exact)


def test_every_catalog_model_can_be_estimated_offline():
    from engine.library.catalog import load_catalog
    from engine.library.fit import catalog_need

    for entry in load_catalog():
        need = catalog_need(entry, "bfloat16", 4096)
        # 16-bit weights are about the published download (the safetensors at 16 bits)
        assert abs((need.weights_bytes + need.vision_bytes) / (entry.download_gb * 1e9) - 1) < 0.06, entry


def test_cache_folder_follows_the_hub_environment(monkeypatch, tmp_path):
    from engine.library.hub import hub_cache_dir
    from engine.library.installed import resolve_model

    for name in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub_cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hub_cache_dir() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    assert hub_cache_dir() == tmp_path / "cache"
    assert resolve_model("acme/not-here") is None and resolve_model("not a repo id") is None


def test_the_built_in_model_is_counted_to_its_last_weight():
    """The demo model's vision tower is a LeViT (convolutions and stages, no ViT layout): the
    Models page still sizes it, counted as built, to the parameter its weights file holds."""
    import json

    from safetensors import safe_open

    from engine.platform.paths import DEMO_MODEL

    config = json.loads((DEMO_MODEL / "config.json").read_text())
    with safe_open(str(DEMO_MODEL / "model.safetensors"), "pt") as f:
        saved = {k: f.get_slice(k).get_shape() for k in f.keys()}  # noqa: SIM118 (a safetensors file is not iterable)
    numel = lambda keys: sum(math.prod(saved[k]) for k in keys)  # noqa: E731
    # buffers (BatchNorm running statistics, LeViT's attention-bias index) are saved but are not parameters
    buffers = [k for k in saved if k.endswith(("running_mean", "running_var", "num_batches_tracked", "_idxs"))]
    vision = [k for k in saved if "vision_tower." in k or "multi_modal_projector." in k]
    counted = count_params(config)
    assert counted.vision == numel(set(vision) - set(buffers))
    assert counted.total == numel(set(saved) - set(buffers))


def test_a_count_reads_as_catalogs_write_it_and_the_loaded_format_is_the_precision():
    from engine.library.fit import params_text, running_precision

    assert [params_text(n) for n in (2_630_000, 256_000_000, 2_210_000_000, 870_000, 12)] == [
        "2.63M",
        "256M",
        "2.21B",
        "870K",
        "12",
    ]
    assert [running_precision(w) for w in ("fp32", "bf16", "int8", "int4")] == ["float32", "bfloat16", "int8", "int4"]
    assert running_precision("") in ("float32", "bfloat16", "float16")  # nothing loaded: what this device runs
