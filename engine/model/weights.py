"""Weight formats of the language model: full precision (bf16/fp16/fp32), int8 weight-only
(quantized by torchao, run by engine/model/int8_layers.py), int4 (llama.cpp Q4_0's blocks, CPU,
engine/model/row_kernels.py) and 4-bit NF4 (bitsandbytes, for CUDA); `auto` picks the largest that
fits free memory.

Only the language model is quantized. The vision tower and projector (the family's
`vision_modules`) stay in full precision, so the elastic encoder still reloads them from the
folder's safetensors and picture features do not depend on the weight format.
"""

from __future__ import annotations

import importlib.metadata
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from ..device import choice as devices
from ..protocol.settings import WEIGHT_FORMATS
from . import packed_linear, row_kernels, shared_input
from .families import FAMILIES
from .folder_check import ModelLoadError
from .int8_layers import layout as int8_layout, pack_int8
from .speed import FormatSpeed


def pick_dtype(device: torch.device, requested: str = "auto") -> torch.dtype:
    """The compute dtype devices.pick_dtype chooses, its refusal as a ModelLoadError."""
    try:
        return devices.pick_dtype(device, requested)[0]
    except devices.DeviceError as exc:
        raise ModelLoadError(str(exc)) from None


FLOAT_FORMATS = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPES_BY_NAME = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
QUANTIZED_FORMATS = ("int8", "int4", "4bit")
FORMATS = WEIGHT_FORMATS
# the library behind each quantized format (its version is part of the KV store namespace)
LIBRARY = {"int8": "torchao", "int4": "numba", "4bit": "bitsandbytes"}
# devices each quantized format really runs on in this build (checked by tests on CPU, by the
# device bench on CUDA); Apple GPUs have neither torchao's int8 kernels nor bitsandbytes
DEVICES = {"int8": ("cpu", "cuda"), "int4": ("cpu",), "4bit": ("cpu", "cuda")}
NF4_BLOCK = 64  # bitsandbytes' NF4 block size: one absmax per 64 weights
# bitsandbytes' NF4 on a CPU decoded at 0.12x bf16 (2-core EPYC, Qwen2-VL-2B shape); torch's fused
# int4 CPU kernel was measured too: on 2 Sapphire Rapids cores it is compute-bound, no faster per
# token than packed bf16. The CPU's 4-bit format is int4 (row_kernels.py: numba kernels)
NF4_ON_CPU = (
    "Weights: 4bit — NF4 is for CUDA: on a CPU it saves memory but decodes several times slower than bf16; "
    "int4 is the CPU's 4-bit format"
)


@dataclass(frozen=True)
class WeightPlan:
    format: str  # what is loaded: bf16 | fp16 | fp32 | int8 | 4bit
    dtype: torch.dtype  # compute dtype: activations, KV cache, and the vision tower's weights
    note: str = ""  # auto: which format it chose and why (shown in the status bar)
    packed: bool = False  # full precision on a CPU: linears prepacked for oneDNN (packed_linear.py)
    decode_dtype: torch.dtype | None = None  # int8 on a CPU: its decoded rows' dtype, where not `dtype`
    rows: bool = False  # on a CPU: decoded rows through numba's kernels (row_kernels.py); int4 always
    # on a CPU, bf16/fp16 compute: the vision tower's products, and with `rows` the language model's
    # prompt chunks, computed in fp32 (row_kernels.half_prompt_path: where this CPU runs that faster)
    fp32_products: bool = False

    @property
    def quantized(self) -> bool:
        return self.format in QUANTIZED_FORMATS

    def fingerprint_part(self) -> bytes:
        """What the model fingerprint (and so the KV store namespace) adds for this format.
        Full-precision formats are covered by the dtype, plus the packed kernels' layout when
        packed; quantized ones add the format and the library version, whose rounding the KV
        depends on."""
        rows = f";rows={row_kernels.layout()};numba={row_kernels.version()}" if self.rows else ""
        if self.fp32_products:
            rows += ";products=fp32"
        if not self.quantized:
            return (f"kernel={packed_linear.LAYOUT}" if self.packed else "").encode() + rows.encode()
        lib = LIBRARY[self.format]
        layout = f";layout={int8_layout()}" if self.format in ("int8", "int4") else ""  # how int8 is multiplied
        if self.decode_dtype is not None:
            layout += f";decode={self.decode_dtype}"
        return f"weights={self.format};{lib}={importlib.metadata.version(lib)}{layout}{rows}".encode()


def format_name(dtype: torch.dtype) -> str:
    return {v: k for k, v in FLOAT_FORMATS.items()}[dtype]


def check_format(requested: str) -> str:
    name = (requested or "auto").strip().lower()
    if name not in FORMATS:
        raise ModelLoadError(f"unknown weights format {requested!r} (use {', '.join(FORMATS)})")
    return name


def refusal(fmt: str, device: torch.device) -> str | None:
    """Why `fmt` cannot run on `device`, or None when it can."""
    if fmt not in QUANTIZED_FORMATS:
        return None
    if device.type not in DEVICES[fmt]:
        where = " and ".join(d.upper() for d in DEVICES[fmt])
        return f"{fmt} weights are not available on {device.type} (they run on {where}); choose bf16, fp16 or fp32"
    lib = LIBRARY[fmt]
    try:
        importlib.metadata.version(lib)
    except importlib.metadata.PackageNotFoundError:
        return f"{fmt} weights need the {lib} package, which is not installed (see requirements.txt)"
    return None


def skip_modules(family: str) -> list[str]:
    """Modules never quantized: the family's vision encoder and projector."""
    return list(FAMILIES[family].vision_modules)


# ------------------------------------------------------------------ size estimate (no weights read)


def _is_vision_key(key: str, family: str) -> bool:
    bare = key.removeprefix("model.")
    return any(
        bare == m.removeprefix("model.") or bare.startswith(m.removeprefix("model.") + ".")
        for m in FAMILIES[family].vision_modules
    )


def estimate_bytes(folder: Path, family: str, fmt: str, dtype: torch.dtype, packed: bool = False) -> int:
    """Bytes of all weights when loaded as `fmt`, from the safetensors headers' shapes. `packed`:
    a tied output head gets its own packed copy of the token embedding (packed_linear.py)."""
    size = torch.empty((), dtype=dtype).element_size()
    total = embedding = 0
    head = False
    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(f, framework="pt") as sf:
            for key in sf.keys():  # noqa: SIM118 (a safetensors file is not iterable)
                shape = sf.get_slice(key).get_shape()
                n = 1
                for d in shape:
                    n *= d
                matrix = len(shape) == 2 and key.endswith(".weight")
                if not _is_vision_key(key, family):
                    head = head or key.endswith("lm_head.weight")
                    embedding = n * size if key.endswith("embed_tokens.weight") else embedding
                if _is_vision_key(key, family) or not matrix or fmt in FLOAT_FORMATS:
                    total += n * size
                elif fmt == "int8" or (fmt == "int4" and not _is_layer_key(key)):
                    total += n + shape[0] * size  # int8 values + a scale per row (int4: embedding and head)
                elif fmt == "int4":  # 16 bytes of nibbles and an fp16 scale per 32 weights
                    total += -(-shape[1] // 32) * 18 * shape[0]
                elif key.endswith("embed_tokens.weight") or key.endswith("lm_head.weight"):
                    total += n * size  # NF4 keeps the token embedding and output head full precision
                else:  # two weights a byte + one 8-bit absmax per block (nested statistics)
                    total += n // 2 + n // NF4_BLOCK
    return total + (embedding if packed and fmt in FLOAT_FORMATS and not head else 0)


def _is_layer_key(key: str) -> bool:
    """A linear inside the language model's layers (not its token embedding or output head)."""
    return not (key.endswith("embed_tokens.weight") or key.endswith("lm_head.weight"))


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def _packed(fmt: str, device: torch.device, speeds: dict[str, FormatSpeed]) -> bool:
    """Pack a full-precision format's linears on the CPU: as measured here when it was (calibrate.py),
    else bf16 only (its plain path reorders the whole weight per call; fp32 runs MKL's GEMV and fp16
    a plain kernel, neither slower plain on the CPUs measured)."""
    if device.type != "cpu" or fmt not in FLOAT_FORMATS or not packed_linear.available(FLOAT_FORMATS[fmt]):
        return False
    if _rows(fmt, device, speeds):  # the numba kernels read the plain weights
        return False
    return speeds[fmt].packed if fmt in speeds else fmt == "bf16"


def _rows(fmt: str, device: torch.device, speeds: dict[str, FormatSpeed]) -> bool:
    """Decoded rows through numba's kernels on the CPU: int4 always (its only kernel), other
    formats where calibrate.py measured them faster than torch's."""
    if device.type != "cpu":
        return False
    return fmt == "int4" or (fmt in speeds and speeds[fmt].rows)


def _plan(
    fmt: str,
    dtype: torch.dtype,
    device: torch.device,
    speeds: dict[str, FormatSpeed],
    note: str = "",
    decode_dtype: torch.dtype | None = None,
) -> WeightPlan:
    rows = _rows(fmt, device, speeds)
    fp32_products = (
        device.type == "cpu"
        and dtype in (torch.bfloat16, torch.float16)
        and row_kernels.half_prompt_path(dtype) == "fp32"
    )
    return WeightPlan(
        fmt, dtype, note, _packed(fmt, device, speeds), None if rows else decode_dtype, rows, fp32_products
    )


def _rates(s: FormatSpeed) -> str:
    return f"{s.format} {s.decode_tok_s:.1f} tok/s decoding, {s.prefill_tok_s:.0f} prefilling"


def fastest_first(speeds: dict[str, FormatSpeed], formats: list[str]) -> tuple[list[str], str]:
    """`formats` ordered by this machine's measured turn time (speed.py: a 512-token prompt and a
    128-token reply), unmeasured ones last in their given order; and why, in words."""
    measured = sorted((f for f in formats if f in speeds), key=lambda f: speeds[f].turn_s())
    order = measured + [f for f in formats if f not in speeds]
    if len(measured) < 2:
        return order, ""
    return order, f"measured on this CPU: {'; '.join(_rates(speeds[f]) for f in measured)}"


def plan_weights(
    folder: Path,
    family: str,
    device: torch.device,
    dtype_request: str,
    requested: str,
    free_bytes: int,
    speeds: dict[str, FormatSpeed] | None = None,
) -> WeightPlan:
    """The format to load and the compute dtype; refuses what cannot run with a ModelLoadError.
    `speeds` (calibrate.py, CPU only): how fast each format ran here; with them `auto` tries the
    full-precision formats fastest first, and a quantized format computes in the dtype it ran
    fastest with, unless a dtype was asked for."""
    fmt = check_format(requested)
    speeds = speeds or {}
    auto_dtype = dtype_request in ("", "auto")
    if fmt in FLOAT_FORMATS:
        dtype = FLOAT_FORMATS[fmt]
        if not auto_dtype and pick_dtype(device, dtype_request) != dtype:
            raise ModelLoadError(
                f"weights {fmt} and dtype {dtype_request} disagree: set dtype to auto, "
                f"or choose the weights format {format_name(pick_dtype(device, dtype_request))}"
            )
        return _plan(fmt, dtype, device, speeds)
    dtype = pick_dtype(device, dtype_request)
    quantized_dtype = {
        q: DTYPES_BY_NAME[speeds[q].dtype] if auto_dtype and q in speeds else dtype for q in QUANTIZED_FORMATS
    }
    # and the dtype its decoded rows ran in, where that was another (int8 on a CPU without bf16 units)
    decode_dtype = {
        q: DTYPES_BY_NAME[speeds[q].decode_dtype] if auto_dtype and q in speeds and speeds[q].decode_dtype else None
        for q in QUANTIZED_FORMATS
    }
    if fmt != "auto":
        why = refusal(fmt, device)
        if why:
            raise ModelLoadError(why)
        return _plan(
            fmt,
            quantized_dtype[fmt],
            device,
            speeds,
            NF4_ON_CPU if fmt == "4bit" and device.type == "cpu" else "",
            decode_dtype[fmt],
        )
    full = format_name(dtype)
    # on CPU, bf16 halves fp32 and still is full precision: tried before the quantized formats
    # (fp16 is not: its narrow range overflows in some models)
    fulls = [full, "bf16"] if full == "fp32" and device.type == "cpu" else [full]
    fulls, why_fastest = fastest_first(speeds, fulls) if auto_dtype else (fulls, "")
    candidates = fulls + [q for q in QUANTIZED_FORMATS if refusal(q, device) is None]
    dtypes = {c: FLOAT_FORMATS.get(c, quantized_dtype.get(c, dtype)) for c in candidates}
    need = {c: estimate_bytes(folder, family, c, dtypes[c], _packed(c, device, speeds)) for c in candidates}
    for c in candidates:
        # room for the weights plus a tenth for KV cache and activations
        if need[c] * 1.1 <= free_bytes:
            if c == fulls[0]:
                return _plan(
                    c, dtypes[c], device, speeds, f"Weights: {c} — fastest here ({why_fastest})" if why_fastest else ""
                )
            return _plan(
                c,
                dtypes[c],
                device,
                speeds,
                f"Weights: {c} — {fulls[0]} needs {_gib(need[fulls[0]])}, "
                f"{_gib(free_bytes)} free; {c} needs {_gib(need[c])}",
                decode_dtype.get(c),
            )
    smallest = min(candidates, key=lambda c: need[c])
    return _plan(
        smallest,
        dtypes[smallest],
        device,
        speeds,
        f"Weights: {smallest} — no format fits in {_gib(free_bytes)} "
        f"free (smallest needs {_gib(need[smallest])}); loading may fail",
        decode_dtype.get(smallest),
    )


def load_dtype(plan: WeightPlan, folder: Path) -> torch.dtype:
    """The dtype from_pretrained loads in: the compute dtype, except for int4, which loads in the
    files' own floating dtype: the weights then stay views of the file mapping until quantized,
    so loading a bf16 checkpoint to compute in fp32 does not first hold all of it in fp32 (twice
    its size), and the rest is cast afterwards to exactly what loading in fp32 gives."""
    if plan.format != "int4":
        return plan.dtype
    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(f, framework="pt") as sf:
            for key in sf.keys():  # noqa: SIM118 (a safetensors file is not iterable)
                dtype = DTYPES_BY_NAME.get(
                    {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}.get(sf.get_slice(key).get_dtype(), "")
                )
                if dtype is not None:
                    return dtype
    return plan.dtype


def load_kwargs(plan: WeightPlan, family: str, device: torch.device) -> dict:
    """Extra `from_pretrained` arguments: the transformers quantization config for the format."""
    if plan.format == "int8":
        # torchao quantizes the linear layers as they load; finish_load hands them, the token
        # embedding and the output head to engine/model/int8_layers.py (why: see there)
        from torchao.quantization import Int8WeightOnlyConfig
        from transformers import TorchAoConfig

        return {
            "quantization_config": TorchAoConfig(Int8WeightOnlyConfig(), modules_to_not_convert=skip_modules(family))
        }
    if plan.format == "4bit":
        from transformers import BitsAndBytesConfig

        # its CPU backend suggests fetching a faster kernel from the Hub, which Parley never does
        logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)

        # bitsandbytes places weights as it quantizes them: load straight onto the device
        return {
            "device_map": {"": str(device)},
            "quantization_config": BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_compute_dtype=plan.dtype,
                bnb_4bit_use_double_quant=True,
                llm_int8_skip_modules=skip_modules(family) + ["lm_head"],
            ),
        }
    return {}


def finish_load(
    model, plan: WeightPlan, family: str, device: torch.device, elastic: bool = False, data_dir: Path | None = None
) -> None:
    """Place the model on the device and check that only the language model was quantized.
    `elastic`: the engine releases the encoder's weights right after the load (the residency reads
    them back, owned, when a picture needs them), so they are not copied here only to be dropped.
    `data_dir`: where numba's compiled kernels are cached (row_kernels.py)."""
    if plan.format != "4bit":  # bitsandbytes already placed it; `.to` is refused on its models
        model.to(device)
    kernels = None
    if plan.rows:
        kernels = row_kernels.load(data_dir)
        if kernels is None and plan.format == "int4":
            raise ModelLoadError(f"int4 weights need numba's kernels, which failed here ({row_kernels.unavailable()})")
    vision = FAMILIES[family].vision_modules
    if plan.format == "int4" and kernels is not None:  # its layers in 4 bits, embedding and head in int8
        row_kernels.pack_int4(model, vision, kernels)
    if plan.format in ("int8", "int4"):
        pack_int8(model, vision, plan.dtype, plan.decode_dtype, kernels)
    if plan.format == "int4":  # loaded in the files' dtype (load_dtype): the rest now in the compute dtype
        model.to(plan.dtype)
    model.eval()
    if kernels is not None and not plan.quantized:
        row_kernels.use_rows(model, vision, kernels)
    if plan.fp32_products:
        row_kernels.use_fp32_products(model, vision)
    if plan.packed:  # before own_weights: packing reads the file mapping once, copying nothing twice
        packed_linear.pack_linears(model, FAMILIES[family].vision_modules)
    if device.type == "cpu" and (not plan.quantized or plan.format == "int4"):
        own_weights(model, skip=tuple(m + "." for m in FAMILIES[family].vision_modules) if elastic else ())
    if kernels is not None:  # after own_weights, which would copy the views apart
        shared_input.share_inputs(model, vision)
    if plan.quantized:
        check_quantized(model, family, plan.format)


def own_weights(model, skip: tuple[str, ...] = ()) -> None:
    """Copy the weights into the process's own memory. On the CPU, from_pretrained leaves them
    as views of the safetensors file mapping, read from disk page by page as the first turn
    touches them: until then the model holds far less than its size (the memory dock would
    count weights not yet in memory) and that first turn pays the disk reads. One tensor at a
    time, so the extra memory is one tensor's; shared (tied) parameters stay shared. Names under
    `skip` (prefixes) are left as they are."""
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            # a packed weight (oneDNN's own tensor) was made in process memory
            if t.device.type == "cpu" and not t.is_mkldnn and not name.startswith(skip):
                t.data = t.data.clone()


def is_quantized(p: torch.Tensor) -> bool:
    """A bitsandbytes 4-bit parameter, a torchao tensor subclass, or int8_layers' int8 values."""
    data = p.data if isinstance(p, torch.nn.Parameter) else p
    return hasattr(p, "quant_state") or type(data) is not torch.Tensor or data.dtype == torch.int8


def check_quantized(model, family: str, fmt: str) -> None:
    """A wrong skip list quantizes the vision tower (garbage features) or nothing at all (no
    saving): either is refused here rather than served."""
    vision = tuple(m + "." for m in FAMILIES[family].vision_modules)
    quantized = [n for n, p in model.named_parameters() if is_quantized(p)]
    bad = [n for n in quantized if n.startswith(vision)]
    if bad:
        raise ModelLoadError(
            f"{fmt} quantized part of the vision encoder ({bad[0]}); Parley keeps it in full precision"
        )
    if not quantized:
        raise ModelLoadError(f"{fmt}: no language-model weight was quantized (module names not recognised)")
