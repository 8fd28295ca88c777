"""Self-check of the test fixtures: tiny model folders load like real ones and generate
sensibly; test pictures are deterministic; broken files are broken."""

from __future__ import annotations

import hashlib
import io
import json

import pytest
import torch
from PIL import Image

from tests.fixtures.pictures import make_broken_picture, make_not_a_picture, make_picture, picture_bytes
from tests.fixtures.tiny_models import (
    ALL_FAMILIES,
    FAMILIES,
    FAMILY_INFO,
    build_tiny_model,
    expected_image_tokens,
    family_unavailable_reason,
)


def _family_param(family):
    reason = family_unavailable_reason(family)
    marks = [pytest.mark.skip(reason=reason)] if reason else []
    return pytest.param(family, marks=marks, id=family)


ALL = [_family_param(f) for f in ALL_FAMILIES]


def _conversation():
    return [
        {"role": "system", "content": [{"type": "text", "text": "You are a helpful assistant."}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in this image?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A red house by a river."}]},
        {"role": "user", "content": [{"type": "text", "text": "And in this one?"}, {"type": "image"}]},
    ]


@pytest.fixture(scope="module")
def two_pictures(tmp_path_factory):
    d = tmp_path_factory.mktemp("pics")
    paths = [make_picture(d / "a.png", seed=1, size=(64, 48)), make_picture(d / "b.jpg", 2, (40, 90), "JPEG")]
    return [Image.open(p).convert("RGB") for p in paths]


@pytest.mark.parametrize("family", ALL)
def test_tiny_model_loads_renders_and_generates(family, tiny_model, two_pictures):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model_dir = tiny_model(family)
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    tok = processor.tokenizer
    cfg = model.config
    info = FAMILY_INFO[family]

    # Config ids agree with the tokenizer.
    assert model.get_input_embeddings().num_embeddings == len(tok)
    assert cfg.image_token_id == tok.convert_tokens_to_ids(info["image_token"]) == processor.image_token_id
    eos = model.generation_config.eos_token_id
    eos = eos if isinstance(eos, list) else [eos]
    assert tok.eos_token_id in eos
    assert model.generation_config.pad_token_id == tok.pad_token_id
    if family.startswith("qwen"):
        assert cfg.vision_start_token_id == tok.convert_tokens_to_ids("<|vision_start|>")
        assert cfg.vision_end_token_id == tok.convert_tokens_to_ids("<|vision_end|>")
        assert cfg.video_token_id == tok.convert_tokens_to_ids("<|video_pad|>")

    text = processor.apply_chat_template(_conversation(), add_generation_prompt=True, tokenize=False)
    assert text.count(info["placeholder"]) == 2
    assert "helpful assistant" in text and "A red house by a river." in text
    no_prompt = processor.apply_chat_template(_conversation(), add_generation_prompt=False, tokenize=False)
    assert text.startswith(no_prompt) and len(text) > len(no_prompt)

    inputs = processor(text=text, images=two_pictures, return_tensors="pt")
    ids = inputs["input_ids"][0].tolist()

    # Each picture expands to the expected number of image tokens.
    if family in ("idefics3", "smolvlm"):
        layout = processor.image_processor(two_pictures, return_row_col_info=True)
    else:
        layout = inputs
    per_picture = [expected_image_tokens(family, processor, layout, i) for i in range(2)]
    assert all(4 <= n <= 64 for n in per_picture), per_picture
    assert ids.count(cfg.image_token_id) == sum(per_picture)
    runs, run = [], 0
    for t in ids + [-1]:
        if t == cfg.image_token_id:
            run += 1
        elif run:
            runs.append(run)
            run = 0
    if family in ("idefics3", "smolvlm"):  # one run of image_seq_len per tile
        assert set(runs) == {processor.image_seq_len}
    else:
        assert runs == per_picture

    # The vision side yields exactly one feature row per image token.
    feature_inputs = {
        k: v for k, v in inputs.items() if k in ("pixel_values", "image_grid_thw", "pixel_attention_mask")
    }
    with torch.no_grad():
        feats = model.model.get_image_features(**feature_inputs).pooler_output
    assert sum(f.shape[0] for f in feats) == sum(per_picture)
    assert all(f.shape[-1] == cfg.get_text_config().hidden_size for f in feats)

    with torch.no_grad():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=12)
    new = out[0, inputs["input_ids"].shape[1] :].tolist()
    assert len(new) == 12
    assert len(set(new)) > 1
    assert not set(new) & set(eos)


@pytest.mark.parametrize("family", ALL)
def test_build_is_deterministic_per_seed(family, tmp_path):
    def weights_digest(d):
        return hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest()

    a = build_tiny_model(family, tmp_path / "a", seed=3)
    b = build_tiny_model(family, tmp_path / "b", seed=3)
    c = build_tiny_model(family, tmp_path / "c", seed=4)
    assert weights_digest(a) == weights_digest(b) != weights_digest(c)
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    assert json.loads((a / "parley_tiny_model.json").read_text())["family"] == family


def test_families_list():
    assert set(FAMILIES) <= set(ALL_FAMILIES)
    assert {"llava", "qwen2_vl", "qwen2_5_vl", "idefics3"} <= set(FAMILIES)
    with pytest.raises(ValueError):
        build_tiny_model("nope", "/nonexistent")


def test_pictures_are_deterministic_and_distinct(tmp_path):
    a = make_picture(tmp_path / "a.png", seed=5)
    b = make_picture(tmp_path / "b.png", seed=5)
    c = make_picture(tmp_path / "c.png", seed=6)
    assert a.read_bytes() == b.read_bytes() == picture_bytes(5)
    assert a.read_bytes() != c.read_bytes()
    ia, ic = Image.open(a).convert("RGB"), Image.open(c).convert("RGB")
    assert ia.size == (64, 48)
    pixels = zip(ia.get_flattened_data(), ic.get_flattened_data(), strict=True)
    diff = sum(abs(x - y) for pa, pc in pixels for x, y in zip(pa, pc, strict=True))
    assert diff / (64 * 48 * 3) > 20  # clearly different, not a few pixels
    j = make_picture(tmp_path / "d.jpg", seed=5, size=(30, 20), fmt="JPEG")
    assert j.read_bytes()[:2] == b"\xff\xd8"
    assert Image.open(j).size == (30, 20)


def test_broken_and_non_pictures_fail_to_decode(tmp_path):
    broken = make_broken_picture(tmp_path / "broken.png")
    assert broken.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(OSError):
        Image.open(io.BytesIO(broken.read_bytes())).load()
    doc = make_not_a_picture(tmp_path / "doc.pdf")
    assert doc.read_bytes().startswith(b"%PDF")
    with pytest.raises(OSError):  # PIL.UnidentifiedImageError is an OSError
        Image.open(doc)
