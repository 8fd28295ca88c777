"""How fast each weight format runs on this machine: the record of calibrate.py's measurements,
read and written without torch (the Models page reads it to show expected tokens/s).

One JSON file in the data folder (`speed.json`), measured once per machine and model shape:
a machine is its CPU (model name and instruction-set flags), its thread count and the torch
version, since all three decide which kernels run; a shape is the language model's layer sizes.
A record names the compute dtype each format ran with and the tokens/s expected for the whole
language model from one layer's linears (attention over the context is left out: the same for
every format).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..platform.files import atomic_write

FILE = "speed.json"
VERSION = 6  # of the measurement: a record of another version is measured again (2: int8 prompts through the
# int8 GEMM; 3: only where that GEMM is measured faster than the dense one, wall time, not CPU time, and
# int8 in fp32 with its decoded rows in bf16 measured too; 4: numba's one-row kernels and int4; 5: those
# kernels on TBB's threads, int8/bf16/fp16 rows in spans: faster, so the choices may differ; 6: int8's
# decoded rows through the CPU's integer dot instructions)
# the turn `auto` optimises for: a prompt of this many tokens, then this many decoded
TURN_PROMPT, TURN_REPLY = 512, 128
# language models smaller than this are not measured (calibrate.py says why): any format is fast
MEASURED_FROM_PARAMS = 50_000_000
# what describe() says where it has no numbers
SMALL_MODEL = "fast (a small model)"
NOT_MEASURED = "not measured yet"


@dataclass(frozen=True)
class LayerShape:
    hidden: int
    intermediate: int
    q_width: int  # attention heads x head size
    kv_width: int  # key/value heads x head size
    layers: int
    vocab: int

    @classmethod
    def of(cls, text) -> LayerShape:
        """From a text config (object or dict) with the usual transformers names."""
        get: Callable[[str], Any] = (
            (lambda k: text.get(k)) if isinstance(text, dict) else (lambda k: getattr(text, k, None))
        )
        h, heads = int(get("hidden_size")), int(get("num_attention_heads"))
        head_dim = int(get("head_dim") or h // heads)
        kv = int(get("num_key_value_heads") or heads)
        return cls(
            h,
            int(get("intermediate_size")),
            heads * head_dim,
            kv * head_dim,
            int(get("num_hidden_layers")),
            int(get("vocab_size")),
        )

    @classmethod
    def of_config(cls, config: dict) -> LayerShape | None:
        """From a folder's raw config.json: text_config, else the top level (older Qwen2-VL
        files); None when it does not spell the sizes out."""
        text = config.get("text_config") or config
        try:
            return cls.of(text)
        except (TypeError, ValueError):
            return None

    @property
    def key(self) -> str:
        return f"h{self.hidden}-i{self.intermediate}-q{self.q_width}-kv{self.kv_width}-l{self.layers}-v{self.vocab}"

    @property
    def linears(self) -> list[tuple[int, int]]:
        """(out, in) of one layer's matrices: q, k, v, o, gate, up, down."""
        h, i = self.hidden, self.intermediate
        return [(self.q_width, h), (self.kv_width, h), (self.kv_width, h), (h, self.q_width), (i, h), (i, h), (h, i)]

    @property
    def layer_params(self) -> int:
        return sum(o * i for o, i in self.linears)

    @property
    def params(self) -> int:
        """The language model's matrices: its layers and one vocabulary-sized table."""
        return self.layers * self.layer_params + self.vocab * self.hidden


@dataclass(frozen=True)
class FormatSpeed:
    format: str  # bf16 | fp16 | fp32 | int8 | int4
    dtype: str  # compute dtype it ran with: bfloat16 | float16 | float32
    decode_tok_s: float  # expected for the whole language model, one token after another
    prefill_tok_s: float  # expected for a prompt
    packed: bool = False  # full precision: the oneDNN-packed linears ran faster than plain ones
    decode_dtype: str = ""  # int8: the dtype its decoded rows ran in, where not `dtype` (Int8Linear.decode_scale)
    rows: bool = False  # decoded rows through numba's kernels ran faster than through torch's (row_kernels.py)

    def turn_s(self) -> float:
        """Seconds of the turn `auto` optimises for."""
        return TURN_PROMPT / self.prefill_tok_s + TURN_REPLY / self.decode_tok_s


def machine() -> dict:
    """What decides the kernels' speed here, without torch: the CPU's name and flags (Linux:
    /proc/cpuinfo; elsewhere what `platform` says), CPU count and the installed torch."""
    name, flags = platform.processor() or platform.machine(), ""
    try:
        with open("/proc/cpuinfo") as f:
            info = dict(line.split(":", 1) for line in f.read().split("\n\n")[0].splitlines() if ":" in line)
        info = {k.strip(): v.strip() for k, v in info.items()}
        name, flags = info.get("model name", name), info.get("flags", "")
    except OSError:
        pass
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "none"
    return {
        "cpu": name,
        "flags": hashlib.blake2b(flags.encode(), digest_size=8).hexdigest(),
        "cpus": os.cpu_count() or 1,
        "torch": torch_version,
        "version": VERSION,
    }


def _machine_key(m: dict) -> str:
    return hashlib.blake2b(json.dumps(m, sort_keys=True).encode(), digest_size=8).hexdigest()


def read(data_dir: Path | str, shape: LayerShape) -> dict[str, FormatSpeed]:
    """This machine's record for `shape` ({} when it was never measured or the file is damaged)."""
    try:
        doc = json.loads((Path(data_dir) / FILE).read_text())
        return _speeds(doc["machines"][_machine_key(machine())]["shapes"][shape.key]["formats"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def write(data_dir: Path | str, shape: LayerShape, speeds: list[FormatSpeed]) -> None:
    """Add (or replace) this machine's record for `shape`, keeping every other one."""
    path = Path(data_dir) / FILE
    try:
        doc = json.loads(path.read_text())
        doc["machines"].items()
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        doc = {"machines": {}}
    m = machine()
    entry = doc["machines"].setdefault(_machine_key(m), {"machine": m, "shapes": {}})
    entry["shapes"][shape.key] = {"shape": asdict(shape), "formats": [asdict(s) for s in speeds]}
    atomic_write(path, json.dumps(doc, indent=1).encode())


def expected(data_dir: Path | str, config: dict) -> tuple[dict[str, FormatSpeed], bool]:
    """Expected speeds of the model `config` describes on this machine, and whether they were
    measured at its very shape. Otherwise they are scaled from the largest shape measured here
    (decode by the ratio of bytes read per token, prefill by the ratio of work per token); ({},
    False) when nothing was measured on this machine yet (a model loads before any is)."""
    shape = LayerShape.of_config(config)
    if shape is None:
        return {}, False
    exact = read(data_dir, shape)
    if exact:
        return exact, True
    try:
        doc = json.loads((Path(data_dir) / FILE).read_text())
        shapes = doc["machines"][_machine_key(machine())]["shapes"]
        known = [(LayerShape(**e["shape"]), e["formats"]) for e in shapes.values()]
        base, rows = max(known, key=lambda kr: kr[0].params)
        measured = _speeds(rows)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}, False
    per_token = base.params / shape.params  # both decode (bytes) and prefill (multiply-adds) scale so
    return {
        f: replace(s, decode_tok_s=s.decode_tok_s * per_token, prefill_tok_s=s.prefill_tok_s * per_token)
        for f, s in measured.items()
    }, False


def _speeds(rows: list[dict]) -> dict[str, FormatSpeed]:
    return {
        r["format"]: FormatSpeed(
            str(r["format"]),
            str(r["dtype"]),
            float(r["decode_tok_s"]),
            float(r["prefill_tok_s"]),
            bool(r.get("packed", False)),
            str(r.get("decode_dtype", "")),
            bool(r.get("rows", False)),
        )
        for r in rows
    }


def describe(data_dir: Path | str, config: dict) -> str:
    """One line for the Models page and `models list`: expected decode tokens/s per format here,
    or why there are none (a small model is never measured, and speeds scaled down to its size
    would be far off; a larger one is measured the first time a model loads). "" when the config
    does not spell out its sizes."""
    shape = LayerShape.of_config(config)
    if shape is None:
        return ""
    speeds, exact = expected(data_dir, config)
    if not exact and shape.params < MEASURED_FROM_PARAMS:
        return SMALL_MODEL
    if not speeds:
        return NOT_MEASURED
    shown = ", ".join(
        f"{f} {speeds[f].decode_tok_s:.1f}" for f in ("bf16", "fp32", "fp16", "int8", "int4") if f in speeds
    )
    return f"{'' if exact else '~'}{shown} tok/s"
