"""The demo model's training script is reproducible and writes a folder the app can load.

Two short runs of packaging/train_shapes.py with the same seed must write byte-identical
weights (the README promises a rerun gives the shipped weights), and the folder must load
through the standard AutoProcessor / AutoModelForImageTextToText path.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "packaging"))

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def train(out: Path, *extra: str) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "packaging" / "train_shapes.py"), "--vision-steps", "6", "--steps", "6",
         "--batch", "4", "--vision-batch", "8", "--threads", "1", "--out", str(out), *extra],
        check=True, capture_output=True, timeout=240)


def test_same_seed_gives_the_same_weights_and_a_loadable_folder(tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    train(tmp_path / "a")
    train(tmp_path / "b")
    train(tmp_path / "c", "--seed", "7")
    weights = lambda name: (tmp_path / name / "model.safetensors").read_bytes()  # noqa: E731
    assert weights("a") == weights("b")
    assert weights("a") != weights("c"), "the seed should matter"
    processor = AutoProcessor.from_pretrained(tmp_path / "a")
    model = AutoModelForImageTextToText.from_pretrained(tmp_path / "a")
    assert model.config.model_type == "llava"
    assert processor.tokenizer.eos_token_id == model.generation_config.eos_token_id


def test_picture_order_probe_targets_follow_the_pictures():
    from shapes_probes import PictureOrderProbe

    probe = PictureOrderProbe(dim=8, image_token_id=9, tokens_per_picture=2)
    # text, picture 1 (2 tokens), text, picture 2, picture 3, picture 4 (clamped to the last class)
    ids = torch.tensor([[1, 9, 9, 2, 9, 9, 9, 9, 9, 9, 3]])
    is_pic, target = probe.targets(ids)
    assert is_pic.tolist() == [[False, True, True, False, True, True, True, True, True, True, False]]
    assert target.tolist() == [0, 0, 1, 1, 2, 2, 2, 2]
    hidden = torch.zeros(1, ids.shape[1], 8, requires_grad=True)
    probe.loss(hidden, ids).backward()
    assert hidden.grad[0, 0].abs().sum() == 0 and hidden.grad[0, 1].abs().sum() > 0, \
        "only picture tokens are read"
    assert probe.loss(hidden, torch.tensor([[1, 2, 3]])).item() == 0.0, "no pictures, no loss"
