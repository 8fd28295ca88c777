"""What the process holds on the CPU is what the memory dock counts: a model loaded on the CPU
owns its weights (not pages of the file mapping still to be read on first use), and freed heap
is handed back to the operating system (glibc)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from engine.device.heap_trim import return_freed_heap
from engine.model.load import load_model

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def file_mappings(folder: Path) -> list[tuple[int, int]]:
    spans = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip().startswith(str(folder)):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                spans.append((start, end))
    return spans


@linux_only
@pytest.mark.slow
def test_a_model_loaded_on_the_cpu_holds_its_weights_not_the_file_mapping(tiny_model):
    folder = tiny_model("llava").resolve()
    loaded = load_model(folder, "cpu", "float32")  # the files' own dtype: nothing to convert
    spans = file_mappings(folder)
    tensors = [*loaded.model.parameters(), *loaded.model.buffers()]
    in_file = [t.shape for t in tensors if any(a <= t.data_ptr() < b for a, b in spans)]
    assert not in_file, f"{len(in_file)} of {len(tensors)} tensors are still pages of the file mapping"


@linux_only
def test_freed_heap_goes_back_to_the_system():
    if not return_freed_heap():
        pytest.skip("this C library has no malloc_trim")
    blocks = [bytearray(64 << 10) for _ in range(3200)]  # 200 MiB of heap (below the mmap threshold)
    pin = bytearray(64 << 10)  # allocated last: freeing the rest leaves a hole, not a shrinkable top
    held = rss()
    del blocks
    kept = rss()
    return_freed_heap()
    after = rss()
    assert held - kept < 50 << 20 and held - after > 150 << 20, (held >> 20, kept >> 20, after >> 20)
    del pin


@linux_only
@pytest.mark.slow
def test_an_elastic_load_does_not_copy_the_encoder_weights_it_is_about_to_release(tiny_model):
    # the engine releases an elastic encoder right after the load; copying its weights out of
    # the file first would only double the load's memory for a moment (1.3 GB at Qwen2-VL-2B)
    from engine.model.families import FAMILIES

    folder = tiny_model("llava").resolve()
    loaded = load_model(folder, "cpu", "float32", elastic=True)
    spans = file_mappings(folder)
    vision = tuple(m + "." for m in FAMILIES["llava"].vision_modules)
    mapped = {n for n, t in loaded.model.named_parameters() if any(a <= t.data_ptr() < b for a, b in spans)}
    assert mapped and all(n.startswith(vision) for n in mapped)
    assert {n for n, _ in loaded.model.named_parameters() if n.startswith(vision)} == mapped


def test_growth_during_measures_what_a_step_allocates():
    # how the loader measures the tokenizer and processor, which no tensor accounts for
    from engine.device.process_memory import growth_during

    held, grown = growth_during(lambda: bytearray(b"\x01") * (64 << 20))  # written: resident
    assert (60 << 20) <= grown <= (72 << 20), grown >> 20
    del held


@pytest.mark.slow
def test_a_cpu_load_puts_the_tokenizer_and_processor_in_the_dock(tiny_model):
    from engine.device.ledger import build_report

    loaded = load_model(tiny_model("llava").resolve(), "cpu", "float32")
    report = build_report(loaded, {})
    assert report.components["processor"] == loaded.processor_bytes
    total = sum(report.components.values())
    # and numba's kernels, where an earlier load in this process compiled them: nothing else
    parts = ("language_model", "vision_encoder", "processor", "kernels")
    assert total == sum(report.components.get(k, 0) for k in parts)


@pytest.mark.slow
def test_numbas_compiled_kernels_are_in_the_dock(tiny_model, tmp_path):
    # numba, LLVM and the compiled code hold 40-110 MiB no tensor shows (tests/bench/memory_ledger.py)
    from engine.device.ledger import build_report
    from engine.model import row_kernels

    loaded = load_model(tiny_model("llava").resolve(), "cpu", "float32", weights="int4", speed_dir=tmp_path)
    report = build_report(loaded, {})
    assert report.components["kernels"] == loaded.kernel_bytes == row_kernels.memory_bytes() > 1 << 20
