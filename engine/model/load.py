"""Load a vision-language model folder.

A `LoadedModel` holds the transformers model + processor and its `Family` (engine/model/families.py:
the few things that differ between families, such as which modules form the vision encoder and
whether positions are Qwen2-VL's 3-D rope). Whether a folder can be loaded at all is answered
torch-free by engine/model/folder_check.py; the weight format by engine/model/weights.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

# Imported here, not inside load_model: the first import of transformers pulls in torchvision,
# whose torch.fx.wrap() calls leave frame reference cycles behind. Made under load_model's call
# stack, those cycles would hold its frame -- and so the loaded model -- until the garbage
# collector happened to run, long after the engine let the model go.
from transformers import AutoModelForImageTextToText, AutoProcessor

from ..device import choice as devices
from ..device.heap_trim import return_freed_heap
from ..device.process_memory import growth_during
from . import cpu_attention, row_kernels
from .families import FAMILIES, Family
from .folder_check import ModelLoadError, check_folder
from .weights import finish_load, load_dtype, load_kwargs, plan_weights

__all__ = ["LoadedModel", "ModelLoadError", "check_folder", "check_load", "load_model", "free_device_cache"]

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    path: Path
    name: str
    model: Any
    processor: Any
    family: Family
    device: torch.device
    dtype: torch.dtype
    eos_ids: set[int]
    image_token_id: int
    merged_kwargs: dict = field(default_factory=dict)
    fingerprint: bytes = b""
    notes: tuple[str, ...] = ()  # device / dtype fallbacks, told to the user
    weights: str = ""  # the language model's weight format as loaded: bf16 | fp16 | fp32 | int8 | 4bit
    weights_note: str = ""  # auto: which format it chose and why
    processor_bytes: int = 0  # host memory the tokenizer and processor took, measured around their load
    kernel_bytes: int = 0  # host memory numba's compiled kernels hold in this process (row_kernels.memory_bytes)

    @property
    def context_tokens(self) -> int | None:
        text = self.model.config.get_text_config(decoder=True)
        return getattr(text, "max_position_embeddings", None)

    @property
    def tokenizer(self):
        return self.processor.tokenizer

    def module(self, dotted: str):
        obj = self.model
        for part in dotted.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                return None
        return obj

    def vision_parameters(self):
        for name in self.family.vision_modules:
            mod = self.module(name)
            if mod is not None:
                yield from mod.parameters()


def weights_identity(path: Path) -> bytes:
    """Cheap identity of the weight files: names, sizes and mtimes (no full read of GBs)."""
    h = hashlib.blake2b(digest_size=16)
    for f in sorted(path.glob("*.safetensors")):
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.digest()


@contextlib.contextmanager
def _progress_only_on_a_terminal():
    """transformers draws a "Loading weights" bar on stderr; where stderr is a pipe or a log
    (headless commands, the window app) it is noise between messages, so it is shown only on a
    terminal."""
    from transformers.utils import logging as hf_logging

    show = sys.stderr is not None and sys.stderr.isatty()
    was = hf_logging.is_progress_bar_enabled()
    if show != was:
        (hf_logging.enable_progress_bar if show else hf_logging.disable_progress_bar)()
    try:
        yield
    finally:
        if show != was:
            (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


def free_device_cache(device: torch.device | None = None) -> None:
    """Hand memory the caching allocator keeps back to the device once tensors are gone."""
    return_freed_heap()  # the host's too: weights and buffers on the CPU
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available() and (device is None or device.type == "mps"):
        try:
            torch.mps.empty_cache()
        except RuntimeError as exc:  # a torch built without the MPS backend: nothing held there
            log.debug("MPS cache not emptied: %s", exc)


def check_load(path: str | os.PathLike, device: str = "auto", dtype: str = "auto", weights: str = "auto") -> None:
    """Refuse, before anything is released or read, what load_model would refuse whatever memory
    is free: a folder that is no model, an unknown device, a weights/dtype/device combination
    that cannot run (ModelLoadError with one sentence)."""
    folder = Path(path).expanduser().resolve()
    config = check_folder(folder)
    try:
        place = devices.choose(device, dtype)
    except devices.DeviceError as exc:
        raise ModelLoadError(str(exc)) from None
    plan_weights(folder, config["model_type"], place.device, dtype, weights, 1 << 62)


def load_model(
    path: str | os.PathLike,
    device: str = "auto",
    dtype: str = "auto",
    weights: str = "auto",
    budget_bytes: int | None = None,
    elastic: bool = False,
    speed_dir: Path | None = None,
) -> LoadedModel:
    """`speed_dir`: where this machine's measured format speeds are kept (the data folder); on a
    CPU, `auto` weights and a quantized format's compute dtype follow them (calibrate.py). Without
    it, `auto` ranks formats by their size alone."""
    from ..device.ledger import device_totals

    folder = Path(path).expanduser().resolve()
    config = check_folder(folder)
    try:
        place = devices.choose(device, dtype)
    except devices.DeviceError as exc:
        raise ModelLoadError(str(exc)) from None
    dev = place.device
    notes = [place.note] if place.note else []
    family = config["model_type"]
    free = min(device_totals(dev)[2], budget_bytes or 1 << 62)  # `auto` weights: what fits here
    speeds = {}
    if speed_dir is not None and dev.type == "cpu" and (weights in ("", "auto") or dtype in ("", "auto")):
        from .calibrate import speeds_for

        speeds = speeds_for(config, speed_dir)
    plan = plan_weights(folder, family, dev, dtype, weights, free, speeds)
    dt, fmt = plan.dtype, plan.format
    try:
        processor, processor_bytes = growth_during(lambda: AutoProcessor.from_pretrained(folder))
    except Exception as exc:  # transformers raises many kinds; the user needs one sentence
        raise ModelLoadError(f"Cannot load the processor/tokenizer from {folder}: {exc}") from exc
    if plan.rows:  # after the processor: each one's memory is measured as the growth around its load
        row_kernels.prepare(speed_dir)  # ready by the time the weights are: joined below
    if not getattr(processor, "chat_template", None) and not getattr(processor.tokenizer, "chat_template", None):
        raise ModelLoadError(f"{folder} has no chat template, so Parley cannot format a conversation for it")
    if getattr(processor, "image_token", None) is None:
        raise ModelLoadError(f"The processor in {folder} has no image token; it is not a vision-language model")
    try:
        with _progress_only_on_a_terminal():
            model = AutoModelForImageTextToText.from_pretrained(
                folder, dtype=load_dtype(plan, folder), use_safetensors=True, **load_kwargs(plan, family, dev)
            )
    except Exception as exc:
        raise ModelLoadError(f"Cannot load the model weights from {folder} as {plan.format}: {exc}") from exc
    if plan.rows and row_kernels.load(speed_dir) is None:  # numba cannot serve here: one line logged
        if plan.format == "int4":
            raise ModelLoadError(
                f"int4 weights need numba's kernels, which do not run here ({row_kernels.unavailable()})"
            )
        plan = replace(plan, rows=False)
    try:
        finish_load(model, plan, family, dev, elastic, speed_dir)
    except ModelLoadError:
        raise
    except RuntimeError as exc:  # e.g. an op or dtype this Mac's GPU lacks, or too little memory
        if dev.type != "mps" or plan.quantized:
            raise ModelLoadError(f"Cannot move the model to {dev}: {exc}") from exc
        notes.append(
            f"The model could not be placed on the Apple GPU ({str(exc).splitlines()[0]}): "
            "it runs on the CPU in float32, which is slower."
        )
        dev, dt, fmt = torch.device("cpu"), torch.float32, "fp32"
        del model
        try:
            devices.release_cached(torch.device("mps"))
        except RuntimeError:
            pass
        try:  # from the files again: a cast back from float16 would have lost precision
            model = AutoModelForImageTextToText.from_pretrained(folder, dtype=dt, use_safetensors=True)
        except Exception as exc2:
            raise ModelLoadError(f"Cannot load the model weights from {folder}: {exc2}") from exc2
        model.eval()
    cpu_attends = cpu_attention.applies(dev, dt)  # after the fallback above: where it runs
    if cpu_attends:
        cpu_attention.use(model)
    for note in notes:
        log.warning("%s", note)

    eos: set[int] = set()
    gen_eos = getattr(model.generation_config, "eos_token_id", None)
    for value in gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos]:
        if value is not None:
            eos.add(int(value))
    if processor.tokenizer.eos_token_id is not None:
        eos.add(int(processor.tokenizer.eos_token_id))

    # transformers' private kwargs merge: the same defaults processor(...) would apply
    merged = processor._merge_kwargs(tokenizer_init_kwargs=processor.tokenizer.init_kwargs)
    for k in ("return_tensors", "return_mm_token_type_ids", "return_text_replacement_offsets"):
        merged["text_kwargs"].pop(k, None)
    merged["images_kwargs"]["return_tensors"] = "pt"

    # the engine checks prompt length against the model's real context itself (engine/local/pipeline.py)
    processor.tokenizer.model_max_length = 1 << 40

    image_token_id = getattr(model.config, "image_token_id", None)
    if image_token_id is None:
        image_token_id = getattr(model.config, "image_token_index", None)
    if image_token_id is None:
        image_token_id = processor.tokenizer.convert_tokens_to_ids(processor.image_token)

    fp = hashlib.blake2b(digest_size=32)
    fp.update(json.dumps(config, sort_keys=True).encode())
    fp.update(weights_identity(folder))
    fp.update(str(dt).encode())
    fp.update(plan.fingerprint_part())
    if cpu_attends:
        fp.update(cpu_attention.LAYOUT.encode())
    name = folder.name
    log.info("loaded %s (%s) on %s as %s, weights %s", name, family, dev, dt, fmt)
    return LoadedModel(
        path=folder,
        name=name,
        model=model,
        processor=processor,
        family=FAMILIES[config["model_type"]],
        device=dev,
        dtype=dt,
        eos_ids=eos,
        image_token_id=int(image_token_id),
        merged_kwargs=merged,
        fingerprint=fp.digest(),
        notes=tuple(notes),
        weights=fmt,
        weights_note=plan.note,
        processor_bytes=processor_bytes,
        kernel_bytes=row_kernels.memory_bytes() if dev.type == "cpu" else 0,
    )
