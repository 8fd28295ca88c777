"""Shared helpers for engine tests: a running engine over a model folder, and the reference
greedy reply from a fresh full prefill with `model.generate`."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import torch
from PIL import Image

from engine.local.engine import Engine
from engine.local.prompt import render
from engine.model.load import load_model
from engine.pictures.ref import PictureRef
from engine.protocol.client import load_blocking, run_blocking
from engine.protocol.events import MemoryReport, Message, Notice, Sampling, SpillState, Turn, TurnDone
from engine.protocol.settings import EngineSettings
from engine.vision.pictures import pixel_limit

ROOT = Path(__file__).resolve().parents[2]


def open_engine(model_dir: Path, data_dir: Path, notices: list | None = None, **settings) -> Engine:
    """A started engine with the model loaded; `notices` collects Notice messages from the start."""
    engine = Engine(EngineSettings().with_changes(settings), data_dir).start()
    if notices is not None:
        engine.add_listener(lambda e: notices.append(e.message) if isinstance(e, Notice) else None)
    load_blocking(engine, str(model_dir))
    return engine


def ask(engine: Engine, cid: str, messages: list[Message], max_new_tokens: int = 8, system: str | None = None):
    result = run_blocking(engine, Turn(cid, list(messages), Sampling(max_new_tokens=max_new_tokens), system))
    return result


class Reference:
    """The model loaded afresh; replies come from a full prefill of the whole conversation."""

    def __init__(self, model_dir: Path, **load):
        self.loaded = load_model(model_dir, **load)  # e.g. weights="int8": exactness is per weight format

    def prompt_ids(self, messages: list[Message], system: str | None = None) -> tuple[list[int], dict]:
        processor = self.loaded.processor
        text = render(processor, messages, system)
        # a page or frame as the engine reads it (rendered within the processor's pixel limit)
        images = [
            Image.open(p.path).convert("RGB") if type(p) is PictureRef else p.picture(pixel_limit(self.loaded))
            for m in messages
            for p in m.images
        ]
        if self.loaded.family.nested_images and images:
            images = [images]
        inputs = processor(text=text, images=images or None, return_tensors="pt")
        return inputs["input_ids"][0].tolist(), inputs

    @torch.inference_mode()
    def reply_ids(self, messages: list[Message], max_new_tokens: int, system: str | None = None) -> list[int]:
        ids, inputs = self.prompt_ids(messages, system)
        out = self.loaded.model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens)
        return out[0, len(ids) :].tolist()


def expect_done(result) -> TurnDone:
    assert isinstance(result, TurnDone), f"turn failed: {getattr(result, 'message', result)}"
    return result


def wait_report(engine, predicate=lambda r: True, timeout=10.0) -> MemoryReport:
    got: list[MemoryReport] = []
    ev = threading.Event()

    def listen(e):
        if isinstance(e, MemoryReport) and predicate(e):
            got.append(e)
            ev.set()

    engine.add_listener(listen)
    try:
        engine.request_memory_report()
        assert ev.wait(timeout), "no memory report"
    finally:
        engine.remove_listener(listen)
    return got[-1]


def spill_now(engine, cid, timeout=20.0) -> SpillState:
    got: list[SpillState] = []
    ev = threading.Event()

    def listen(e):
        if isinstance(e, SpillState) and e.conversation_id == cid and e.state in ("spilled", "failed", "refused"):
            got.append(e)
            ev.set()

    engine.add_listener(listen)
    try:
        engine.spill_now(cid)
        assert ev.wait(timeout), "no spill result"
    finally:
        engine.remove_listener(listen)
    return got[-1]


def run_main(*args, cwd=ROOT, timeout=300):
    """main.py in a child Python, as a user scripts it."""
    return subprocess.run(
        [sys.executable, str(ROOT / "main.py"), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
