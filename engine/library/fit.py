"""Will a model fit? Memory needed at a precision, from the repo's config.json alone.

need = language-model weights at the chosen precision
     + vision tower and projector (always at 16-bit: Parley quantizes only the language model)
     + KV cache: 2 (K and V) x layers x kv_heads x head_dim x bytes x context tokens
Parameter counts come from the architecture (transformers' own config class fills the family's
defaults), so the estimate needs no weights. It leaves out activations and allocator slack;
the verdict's "tight" band (80-100 % of free memory) is there for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model.families import FAMILIES, QKV_BIAS_TEXT_TYPES

# int4: llama.cpp Q4_0's 18 bytes per 32 weights (its token embedding and output head are int8:
# left out here, as NF4's full-precision ones are)
BYTES_PER_PARAM = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "int8": 1.0, "int4": 18 / 32, "4bit": 0.5}
TIGHT_FROM = 0.8  # need above this share of free memory is "tight"
# a weight format (engine/model/weights.py) as the precision the estimate is made at
FORMAT_PRECISION = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp32": "float32",
    "int8": "int8",
    "int4": "int4",
    "4bit": "4bit",
}


def running_precision(weights: str = "") -> str:
    """The precision to size models at: the loaded model's weight format, else what Parley runs a
    model in on this machine (engine/device/choice.py: float32 on a CPU, bfloat16 on CUDA, float16
    on Apple's GPU). Needs no torch."""
    import sys

    if weights in FORMAT_PRECISION:
        return FORMAT_PRECISION[weights]
    if not accelerator_possible():
        return "float32"
    return "float16" if sys.platform == "darwin" else "bfloat16"


def params_text(n: int) -> str:
    """A parameter count as catalogs write it: "256M", "2.21B", "870K"."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


@dataclass(frozen=True)
class ParamCount:
    language: int
    vision: int  # vision tower + projector

    @property
    def total(self) -> int:
        return self.language + self.vision


@dataclass(frozen=True)
class MemoryNeed:
    params: ParamCount
    precision: str
    context: int
    weights_bytes: int  # language model at `precision`
    vision_bytes: int
    kv_bytes_per_token: int
    kv_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.vision_bytes + self.kv_bytes


@dataclass(frozen=True)
class Fit:
    need: MemoryNeed
    device: str  # "cuda:0 (NVIDIA ...)", "mps", "cpu (RAM)"
    free_bytes: int
    verdict: str  # fits | tight | does not fit
    from_catalog: bool = False  # sized from the catalog's numbers, config.json not fetched

    def line(self) -> str:
        gb = 1 << 30
        n = self.need
        about = "~" if self.from_catalog else ""
        return (
            f"{self.verdict}: needs {about}{n.total_bytes / gb:.2f} GiB (weights {n.weights_bytes / gb:.2f} + "
            f"vision {n.vision_bytes / gb:.2f} + KV {n.kv_bytes / gb:.2f} for {n.context} tokens, {n.precision}) "
            f"of {self.free_bytes / gb:.2f} GiB free on {self.device}"
            + (" (estimated from the catalog)" if self.from_catalog else "")
        )


def _config_objects(config: dict):
    from ..model.heavy_imports import heavy

    heavy()  # never alongside the engine thread's own import of transformers
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(**config)
    return cfg, cfg.get_text_config(decoder=True), getattr(cfg, "vision_config", None)


def _tied(config: dict, t) -> bool:
    """The raw file decides: text_config's own flag, else the top-level one (Qwen2-VL puts it there)."""
    raw = config.get("text_config") or {}
    if "tie_word_embeddings" in raw:
        return bool(raw["tie_word_embeddings"])
    if "tie_word_embeddings" in config:
        return bool(config["tie_word_embeddings"])
    return bool(getattr(t, "tie_word_embeddings", False))


def _language_params(t, tied: bool) -> int:
    h, inter, layers, vocab = t.hidden_size, t.intermediate_size, t.num_hidden_layers, t.vocab_size
    heads = t.num_attention_heads
    kv = getattr(t, "num_key_value_heads", None) or heads
    hd = getattr(t, "head_dim", None) or h // heads
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    if t.model_type in QKV_BIAS_TEXT_TYPES:
        attn += heads * hd + 2 * kv * hd
    mlp = 3 * h * inter  # gate, up, down (every supported text family is a gated MLP)
    per_layer = attn + mlp + 2 * h  # two RMSNorms
    embed = vocab * h
    head = 0 if tied else vocab * h
    return embed + layers * per_layer + h + head


def _vision_params(model_type: str, v, text_hidden: int, config) -> int:
    family = FAMILIES[model_type]
    if getattr(v, "depth", None) is None and getattr(v, "num_hidden_layers", None) is None:
        # not a plain ViT (the built-in demo model's LeViT: convolutions and stages): count the
        # tower as built on the meta device (no memory), plus LLaVA's projector
        return _meta_params(v) + _llava_projector(v.hidden_size, text_hidden)
    d = getattr(v, "embed_dim", None) or v.hidden_size
    layers = getattr(v, "depth", None) or v.num_hidden_layers
    inter = getattr(v, "intermediate_size", None) or int(d * getattr(v, "mlp_ratio", 4))
    channels = getattr(v, "in_chans", None) or getattr(v, "num_channels", 3)
    patch = v.patch_size
    attn = 4 * d * d + 4 * d
    if family.vision_mlp == "gated":  # with biases, RMSNorm
        mlp, norms = 3 * d * inter + 2 * inter + d, 2 * d
    else:
        mlp, norms = 2 * d * inter + inter + d, 4 * d
    tower = layers * (attn + mlp + norms)
    if family.vision_patch == "conv3d":
        tower += channels * v.temporal_patch_size * patch * patch * d  # Conv3d, no bias
    else:
        positions = (v.image_size // patch) ** 2
        tower += channels * patch * patch * d + d + positions * d + 2 * d  # patch conv, positions, post-norm
    if family.connector == "merger":
        merged = d * v.spatial_merge_size**2
        out = getattr(v, "out_hidden_size", None) or v.hidden_size
        return tower + d + merged * merged + merged + merged * out + out  # norm + 2 linears
    if family.connector == "pixel_shuffle":
        return tower + d * config.scale_factor**2 * text_hidden  # one linear, no bias
    return tower + _llava_projector(d, text_hidden)


def _llava_projector(vision_hidden: int, text_hidden: int) -> int:
    """LLaVA's two-layer MLP from picture features to the language model's width, with biases."""
    return vision_hidden * text_hidden + text_hidden + text_hidden * text_hidden + text_hidden


def _meta_params(vision_config) -> int:
    import torch
    from transformers import AutoModel

    with torch.device("meta"):
        return sum(p.numel() for p in AutoModel.from_config(vision_config).parameters())


def count_params(config: dict) -> ParamCount:
    cfg, text, vision = _config_objects(config)
    language = _language_params(text, _tied(config, text))
    vis = _vision_params(config["model_type"], vision, text.hidden_size, cfg) if vision is not None else 0
    return ParamCount(language, vis)


def kv_bytes_per_token(config: dict, precision: str = "bfloat16") -> int:
    _cfg, t, _v = _config_objects(config)
    heads = t.num_attention_heads
    kv = getattr(t, "num_key_value_heads", None) or heads
    hd = getattr(t, "head_dim", None) or t.hidden_size // heads
    elem = 4 if precision == "float32" else 2  # quantized weights still keep a 16-bit cache
    return 2 * t.num_hidden_layers * kv * hd * elem


def _check_precision(precision: str) -> None:
    if precision not in BYTES_PER_PARAM:
        raise ValueError(f"unknown precision {precision!r} (use {', '.join(BYTES_PER_PARAM)})")


def _need(params: ParamCount, precision: str, context: int, kv_per_token_16bit: int) -> MemoryNeed:
    elem = 4 if precision == "float32" else 2  # the vision tower and the KV cache stay 16-bit when quantized
    per_token = kv_per_token_16bit * elem // 2
    return MemoryNeed(
        params,
        precision,
        context,
        int(params.language * BYTES_PER_PARAM[precision]),
        params.vision * elem,
        per_token,
        per_token * context,
    )


def memory_need(config: dict, precision: str = "bfloat16", context: int = 4096) -> MemoryNeed:
    _check_precision(precision)
    return _need(count_params(config), precision, context, kv_bytes_per_token(config, "bfloat16"))


def catalog_need(entry, precision: str = "bfloat16", context: int = 4096) -> MemoryNeed:
    """The same estimate from a catalog entry's own numbers (engine.library.catalog.CatalogEntry):
    for when config.json cannot be fetched. Needs no transformers."""
    _check_precision(precision)
    if entry.vision_params is None or entry.kv_bytes_per_token is None:
        raise ValueError(f"the catalog holds no sizes for {entry.repo_id}")
    total = entry.total_params
    return _need(
        ParamCount(total - entry.vision_params, entry.vision_params), precision, context, entry.kv_bytes_per_token
    )


def verdict(need_bytes: int, free_bytes: int) -> str:
    if need_bytes <= TIGHT_FROM * free_bytes:
        return "fits"
    return "tight" if need_bytes <= free_bytes else "does not fit"


def accelerator_possible() -> bool:
    """Whether this machine may have a GPU torch could use (NVIDIA or ROCm drivers, WSL's GPU,
    Apple silicon). False means the CPU for certain, so the probe below imports no torch: with
    transformers (which `heavy()` imports with it) that was 7-9 s of `models list` (measured on a
    shared 2-core Xeon), most of its time."""
    import os
    import platform
    import sys

    if sys.platform == "darwin":
        return platform.machine() == "arm64"
    if sys.platform.startswith("linux"):
        return any(os.path.exists(p) for p in ("/proc/driver/nvidia/version", "/dev/nvidiactl", "/dev/kfd", "/dev/dxg"))
    if sys.platform == "win32":
        import ctypes.util

        return ctypes.util.find_library("nvcuda") is not None
    return True


def free_device_memory() -> tuple[str, int]:
    """(device name, free bytes) of the device Parley would load onto: CUDA, then MPS, then RAM."""
    import sys

    import psutil

    if "torch" not in sys.modules and not accelerator_possible():
        return "cpu (RAM)", int(psutil.virtual_memory().available)

    from ..model.heavy_imports import heavy

    heavy()
    import torch

    if torch.cuda.is_available():
        free, _total = torch.cuda.mem_get_info()
        return f"cuda:0 ({torch.cuda.get_device_name(0)})", int(free)
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        # unified memory: what the OS can still hand out, capped by Metal's working-set limit
        limit = torch.mps.recommended_max_memory() - torch.mps.driver_allocated_memory()
        return "mps", int(min(limit, psutil.virtual_memory().available))
    return "cpu (RAM)", int(psutil.virtual_memory().available)


def estimate_fit(
    config: dict, precision: str = "bfloat16", context: int = 4096, device: tuple[str, int] | None = None
) -> Fit:
    """The whole answer for one model; `device` = (name, free bytes) to skip the probe."""
    need = memory_need(config, precision, context)
    name, free = device or free_device_memory()
    return Fit(need, name, free, verdict(need.total_bytes, free))


def estimate_fit_from_catalog(
    entry, precision: str = "bfloat16", context: int = 4096, device: tuple[str, int] | None = None
) -> Fit:
    """estimate_fit from a catalog entry's numbers (see catalog_need), said to be an estimate."""
    need = catalog_need(entry, precision, context)
    name, free = device or free_device_memory()
    return Fit(need, name, free, verdict(need.total_bytes, free), from_catalog=True)
