"""Where a model runs: CUDA, Apple's MPS or the CPU, the dtype for each, and what the device
says about its memory. The one place that calls torch.cuda / torch.mps device functions.

Automatic choice: CUDA (bfloat16; float16 on GPUs without bfloat16), else MPS (float16, checked
on the device: float32 when the GPU refuses it), else the CPU (float32). A choice that differs
from what was asked comes with a note the engine shows the user.
"""

from __future__ import annotations

import logging
import platform
from dataclasses import dataclass

import psutil
import torch

from .heap_trim import return_freed_heap

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class DeviceError(ValueError):
    """A device or dtype that cannot be used; the message is meant for the user."""


@dataclass(frozen=True)
class Placement:
    device: torch.device
    dtype: torch.dtype
    note: str | None = None  # why the choice differs from what was asked, for the user


def mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return mps is not None and mps.is_available()


def pick_device(requested: str = "auto") -> torch.device:
    requested = (requested or "auto").strip().lower()
    if requested == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(requested)
    except RuntimeError:
        raise DeviceError(f"Unknown device {requested!r} (use auto, cpu, cuda, cuda:N or mps)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(
            "CUDA was asked for, but this torch build or machine has no CUDA GPU "
            "(install the CUDA build of torch, or choose auto / cpu)"
        )
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise DeviceError(f"There is no GPU {dev.index} (this machine has {torch.cuda.device_count()})")
    if dev.type == "mps" and not mps_available():
        raise DeviceError(
            "Apple's GPU (MPS) was asked for, but it is not available here: it needs a Mac "
            "with Apple silicon, macOS 12.3 or later and an arm64 Python"
        )
    return dev


def dtype_runs_on(device: torch.device, dtype: torch.dtype) -> str | None:
    """None when a small matmul in `dtype` runs on `device`; else the device's reason."""
    try:
        a = torch.ones(4, 4, dtype=dtype, device=device)
        (a @ a).sum().item()
        return None
    except (RuntimeError, TypeError) as exc:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def pick_dtype(device: torch.device, requested: str = "auto") -> tuple[torch.dtype, str | None]:
    """(dtype, note for the user or None)."""
    requested = (requested or "auto").strip().lower()
    if requested != "auto":
        if requested not in DTYPES:
            raise DeviceError(f"unknown dtype {requested!r} (use float32, bfloat16 or float16)")
        want = DTYPES[requested]
    elif device.type == "cuda":
        want = torch.bfloat16
    elif device.type == "mps":
        want = torch.float16
    else:
        return torch.float32, None
    if device.type == "cuda" and want is torch.bfloat16 and not torch.cuda.is_bf16_supported():
        return torch.float16, "This GPU has no bfloat16: the model runs in float16."
    if device.type == "mps" and want is not torch.float32:
        why = dtype_runs_on(device, want)
        if why is not None:
            name = str(want).replace("torch.", "")
            return torch.float32, (
                f"This Mac's GPU cannot run {name} ({why}): the model runs in float32, which takes twice the memory."
            )
    return want, None


def choose(requested_device: str = "auto", requested_dtype: str = "auto") -> Placement:
    dev = pick_device(requested_device)
    dtype, note = pick_dtype(dev, requested_dtype)
    return Placement(dev, dtype, note)


# ---------------------------------------------------------------- memory and housekeeping


def memory(device: torch.device) -> tuple[str, int, int]:
    """(device name, total bytes, free bytes): VRAM on CUDA; on MPS the GPU's recommended working
    set less what torch holds there (never more than the system has free: memory is shared);
    system memory on the CPU."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return f"{torch.cuda.get_device_name(device)} ({device})", int(total), int(free)  # which GPU, by index
    vm = psutil.virtual_memory()
    if device.type == "mps":
        try:
            total = int(torch.mps.recommended_max_memory())
            held = int(torch.mps.current_allocated_memory())
            return "Apple GPU (unified memory)", total, max(0, min(total - held, int(vm.available)))
        except RuntimeError:  # the MPS backend refused (e.g. not built in): unified memory is RAM
            return "Apple GPU (unified memory, as system memory)", int(vm.total), int(vm.available)
    name = platform.processor() or platform.machine() or "CPU"
    return f"CPU ({name})", int(vm.total), int(vm.available)


def release_cached(device: torch.device) -> None:
    """Give the allocator's cached, unused blocks back (after unloading weights)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "mps":
        torch.mps.empty_cache()
    else:
        return_freed_heap()


def synchronize(device: torch.device) -> None:
    """Wait for queued work on the device (before handing out tensors filled asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
