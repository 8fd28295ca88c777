"""The published shapes the benchmarks build are the real ones, and a reduced build keeps their
token layout: so a figure "at the Qwen2.5-VL-3B shape" means that shape."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.fixtures import published_configs
from tests.fixtures.published_configs import PUBLISHED, build_published, parameter_count, spec_for


@pytest.mark.parametrize(
    "name, total, vision",
    [
        # parameter counts shown on the checkpoints' model pages (2.21B, 3.75B, 256M)
        ("Qwen2-VL-2B-Instruct", 2.21e9, 0.665e9),
        ("Qwen2.5-VL-3B-Instruct", 3.75e9, 0.669e9),
        ("SmolVLM-256M-Instruct", 0.256e9, 0.0935e9),
    ],
)
def test_full_shapes_have_the_published_parameter_counts(name, total, vision):
    lm, vis = parameter_count(spec_for(name))  # on the meta device: no memory
    assert abs((lm + vis) - total) / total < 0.01, (lm, vis)
    assert abs(vis - vision) / vision < 0.01, vis


def test_reduced_build_keeps_the_special_token_layout(tmp_path, monkeypatch):
    from transformers import AutoConfig, AutoProcessor

    # asked for by two at once (benchmarks run side by side share one folder): built once, and
    # the second waits for it rather than replacing the folder under the first one's reader
    builds = []
    real_build = published_configs._build
    monkeypatch.setattr(published_configs, "_build", lambda *a: builds.append(a) or real_build(*a))
    both = threading.Barrier(2)

    def build():
        both.wait()
        return build_published("Qwen2-VL-2B-Instruct", root=tmp_path, layers=1, vision_layers=1, vocab_size=2048)

    with ThreadPoolExecutor(2) as pool:
        folder, again = pool.map(lambda _: build(), range(2))
    assert folder == again and len(builds) == 1
    cfg = AutoConfig.from_pretrained(folder)
    shift = PUBLISHED["Qwen2-VL-2B-Instruct"]["text"]["vocab_size"] - 2048
    assert cfg.image_token_id == 151655 - shift and cfg.text_config.vocab_size == 2048
    assert cfg.text_config.hidden_size == 1536 and cfg.vision_config.embed_dim == 1280  # widths are kept
    tok = AutoProcessor.from_pretrained(folder).tokenizer
    assert tok.convert_tokens_to_ids("<|image_pad|>") == cfg.image_token_id
    assert tok.convert_tokens_to_ids("<|im_end|>") == 151645 - shift
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    # cached: the same spec is the same folder, not a rebuild
    assert build_published("Qwen2-VL-2B-Instruct", root=tmp_path, layers=1, vision_layers=1, vocab_size=2048) == folder


def test_unknown_shape_is_one_clear_error():
    with pytest.raises(ValueError, match="unknown published shape 'Qwen9'"):
        spec_for("Qwen9")
