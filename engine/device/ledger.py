"""The memory ledger: exact bytes per component, from tensor sizes, for the Memory dock."""

from __future__ import annotations

import torch

from ..protocol.events import EncoderStatus, MemoryReport
from . import choice as devices


def _storage_parts(t):
    """The plain tensors that hold `t`'s data: itself, the inner tensors of a torchao tensor
    subclass (int8 values, scales, zero points), or a bitsandbytes 4-bit weight's packed bytes
    plus its quantization state (absmax, code, nested statistics)."""
    data = t.data if isinstance(t, torch.nn.Parameter) else t
    if hasattr(data, "__tensor_flatten__"):
        names, _ = data.__tensor_flatten__()
        for name in names:
            yield from _storage_parts(getattr(data, name))
        return
    yield data
    state = getattr(t, "quant_state", None)
    while state is not None:
        for value in vars(state).values():
            if isinstance(value, torch.Tensor):
                yield value
        state = getattr(state, "state2", None)


def tensor_bytes(tensors) -> int:
    seen: set[int] = set()
    total = 0
    for t in tensors:
        if t is None or t.device.type == "meta":
            continue
        for part in _storage_parts(t):
            ptr = id(part) if part.is_mkldnn else part.data_ptr()  # oneDNN's packed tensors have no pointer
            if ptr in seen and part.numel():  # tied weights count once
                continue
            seen.add(ptr)
            total += part.numel() * part.element_size()
    return total


def model_bytes(loaded) -> tuple[int, int]:
    """(language-model bytes, vision-encoder bytes) as they sit on the device now."""
    vision_ids = {id(p) for p in loaded.vision_parameters()}
    everything = list(loaded.model.parameters()) + list(loaded.model.buffers())
    lm = tensor_bytes(t for t in everything if id(t) not in vision_ids)
    vision = tensor_bytes(p for p in loaded.vision_parameters())
    return lm, vision


def device_totals(device: torch.device) -> tuple[str, int, int]:
    """(device name, total bytes, free bytes): see devices.memory (CUDA, MPS, CPU)."""
    return devices.memory(device)


def free_for_model(loaded, kv_bytes: int, budget: int | None) -> tuple[int, int]:
    """(bytes free for more model state, safety margin): the device's free memory, or what is
    left of the user's budget when one is set."""
    _, _, free = device_totals(loaded.device)
    if not budget:
        return free, 256 << 20
    lm, vision = model_bytes(loaded)
    return min(free, budget - lm - vision - kv_bytes), 0


def build_report(
    loaded,
    sessions: dict,
    extra_components: dict | None = None,
    counters: dict | None = None,
    encoder_state: EncoderStatus = EncoderStatus.RESIDENT,
    idle_left: float | None = None,
) -> MemoryReport:
    if loaded is None:
        name, total, free = device_totals(torch.device("cpu"))
        return MemoryReport("cpu", name, total, free, {}, {}, counters or {})
    lm, vision = model_bytes(loaded)
    name, total, free = device_totals(loaded.device)
    components = {"language_model": lm, "vision_encoder": vision}
    if loaded.device.type == "cpu":  # device memory is this process's memory: its tokenizer is in it too
        components["processor"] = loaded.processor_bytes
        if loaded.kernel_bytes:  # numba's compiled CPU kernels, loaded once for the process
            components["kernels"] = loaded.kernel_bytes
    kv = {cid: s.kv_bytes() for cid, s in sessions.items() if s.cache is not None}
    components["hot_kv"] = sum(kv.values())
    components.update(extra_components or {})
    return MemoryReport(
        device=str(loaded.device),
        device_name=name,
        total_bytes=total,
        free_bytes=free,
        components=components,
        sessions_kv=kv,
        counters=dict(counters or {}),
        encoder_state=encoder_state,
        encoder_idle_left_s=idle_left,
    )
