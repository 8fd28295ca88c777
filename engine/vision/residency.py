"""Elastic residency of the vision encoder: release its weights when idle, read them back from
the model folder's safetensors when a picture needs encoding.

Only parameters are released (replaced by empty tensors on the same device, not meta tensors:
some models read `self.device` from their first parameter, which is often the vision tower's);
small buffers such as position ids stay, because many are not in the checkpoint. On CUDA the cache
allocator is emptied so the memory really goes back to the device.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch
from safetensors import safe_open

from ..device.choice import release_cached
from ..protocol.events import EncoderStatus

log = logging.getLogger(__name__)


class ResidencyError(RuntimeError):
    pass


class EncoderResidency:
    def __init__(self, loaded, elastic: bool, idle_s: float):
        self.loaded = loaded
        self.idle_s = idle_s
        self.state = EncoderStatus.RESIDENT
        self.last_used = time.monotonic()
        self.loads = 0
        self.unloads = 0
        self.last_load_s = 0.0
        self._keymap: dict[str, tuple[Path, str]] | None = None
        self._shapes: dict[str, torch.Size] = {}
        self.disabled_reason: str | None = None
        self.elastic = False
        self.set_elastic(elastic)

    def set_elastic(self, on: bool) -> bool:
        """Turn elastic residency on or off; returns whether it is now on. Releasing the weights
        needs the map to read them back, so it is built the first time elastic is turned on —
        at load or later from the settings; a model whose files lack the vision weights stays
        resident for good, with the reason kept."""
        if self.disabled_reason is not None:
            return False
        if on and self._keymap is None:
            try:
                self._keymap = self._build_keymap()
            except ResidencyError as exc:
                log.warning("elastic encoder disabled: %s", exc)
                self.disabled_reason = str(exc)
                return False
        self.elastic = on
        return on

    # -------------------------------------------------------------- weights on disk

    def _param_names(self) -> list[str]:
        names = []
        for prefix in self.loaded.family.vision_modules:
            mod = self.loaded.module(prefix)
            if mod is None:
                continue
            names += [f"{prefix}.{n}" for n, _ in mod.named_parameters()]
        return names

    def _build_keymap(self) -> dict[str, tuple[Path, str]]:
        """Parameter name -> (safetensors file, checkpoint key). Checkpoints name the vision
        weights either like the model (`model.visual.*`) or in the older layout without the
        leading `model.` (`visual.*`, `vision_tower.*`); both are accepted."""
        folder = self.loaded.path
        index = folder / "model.safetensors.index.json"
        where: dict[str, Path] = {}
        if index.is_file():
            for key, fname in json.loads(index.read_text())["weight_map"].items():
                where[key] = folder / fname
        else:
            for f in sorted(folder.glob("*.safetensors")):
                with safe_open(f, framework="pt") as sf:
                    for key in sf.keys():  # noqa: SIM118 (a safetensors file is not iterable)
                        where[key] = f
        out: dict[str, tuple[Path, str]] = {}
        for name in self._param_names():
            for candidate in (name, name.removeprefix("model.")):
                if candidate in where:
                    out[name] = (where[candidate], candidate)
                    break
            else:
                raise ResidencyError(f"the vision weight {name} is not in the model's safetensors files")
        return out

    # -------------------------------------------------------------- state changes

    def _params(self):
        for prefix in self.loaded.family.vision_modules:
            mod = self.loaded.module(prefix)
            if mod is None:
                continue
            for mname, sub in mod.named_modules():
                for pname, p in list(sub._parameters.items()):
                    if p is not None:
                        full = ".".join(x for x in (prefix, mname, pname) if x)
                        yield full, sub, pname, p

    def unload(self) -> bool:
        if not self.elastic or self._keymap is None or self.state != EncoderStatus.RESIDENT:
            return False
        for full, sub, pname, p in list(self._params()):
            self._shapes[full] = p.shape
            # torch's private parameter table, written directly: only the tensor in this slot changes
            sub._parameters[pname] = torch.nn.Parameter(
                torch.empty(0, dtype=p.dtype, device=p.device), requires_grad=False
            )
        release_cached(self.loaded.device)  # CUDA / MPS: the freed weights go back to the device
        self.state = EncoderStatus.UNLOADED
        self.unloads += 1
        return True

    def ensure_loaded(self) -> bool:
        """Load the weights if they are released; returns True when a load happened."""
        if self.state == EncoderStatus.RESIDENT:
            return False
        if self._keymap is None:  # never released without one (set_elastic); say so, never hang
            raise ResidencyError("the encoder's weights were released with no map to read them back")
        t0 = time.perf_counter()
        self.state = EncoderStatus.LOADING
        by_file: dict[Path, list[tuple[str, str]]] = {}
        for name, (f, key) in self._keymap.items():
            by_file.setdefault(f, []).append((name, key))
        dev = self.loaded.device
        tensors: dict[str, torch.Tensor] = {}
        try:
            for f, items in by_file.items():
                with safe_open(f, framework="pt", device=str(dev) if dev.type == "cuda" else "cpu") as sf:
                    for name, key in items:
                        tensors[name] = sf.get_tensor(key)
            for full, sub, pname, p in list(self._params()):
                t = tensors[full]
                want = tuple(self._shapes.get(full, p.shape))
                if tuple(t.shape) != want:
                    raise ResidencyError(f"{full}: checkpoint shape {tuple(t.shape)} != model {want}")
                value = t.to(device=dev, dtype=p.dtype)
                if value is t and value.device.type == "cpu":
                    # still a lazy view of the file mapping: read it now, so the disk reads are
                    # counted in this load (not in the first encode) and the file is let go
                    value = t.clone()
                sub._parameters[pname] = torch.nn.Parameter(value, requires_grad=False)
            tensors.clear()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)  # the copies are done when the clock stops
        except Exception:
            self.state = EncoderStatus.UNLOADED
            raise
        self.state = EncoderStatus.RESIDENT
        self.loads += 1
        self.last_load_s = time.perf_counter() - t0
        return True

    def touch(self) -> None:
        """An encode happened: restart the idle clock (only encodes do this, never cache hits)."""
        self.last_used = time.monotonic()

    def idle_left(self) -> float | None:
        if not self.elastic or self.state != EncoderStatus.RESIDENT:
            return None
        return max(0.0, self.idle_s - (time.monotonic() - self.last_used))

    def due_for_unload(self) -> bool:
        left = self.idle_left()
        return left is not None and left <= 0.0

    def weight_bytes(self) -> int:
        """Bytes the encoder needs when resident (from shapes, whatever the state)."""
        total = 0
        for full, _, _, p in self._params():
            total += self._shapes.get(full, p.shape).numel() * p.element_size()
        return total
