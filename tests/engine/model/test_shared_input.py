"""Sibling linears that read the same input (engine/model/shared_input.py): one kernel call for a
decoded row's q/k/v (and gate/up), each member's columns exactly what it computes alone, one copy
of the weights, and a layer that feeds them anything else gets each member alone again."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from engine.device.ledger import tensor_bytes
from engine.model import row_kernels
from engine.model.int8_layers import Int8Linear
from engine.model.load import load_model
from engine.model.prompt_rows import PROMPT_ROWS
from engine.model.row_kernels import Int4Linear, Int4Weights, RowLinear
from engine.model.shared_input import share_inputs

# int4 in the integer-dot layouts (row after row); a path this CPU lacks is skipped
FORMATS = ("fp32", "bf16", "fp16", "int8", "int4:vnni512", "int4:vnni256", "int4:avx2")
WIDTH, OUTS = 1100, (96, 32, 32)  # 1100: rows of several spans (numba_rows.SPAN_BYTES)


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    k = row_kernels.load(tmp_path_factory.mktemp("data"))
    assert k is not None, row_kernels.unavailable()
    return k


def _linear(fmt: str, weight: torch.Tensor, bias: torch.Tensor | None, k) -> nn.Module:
    frozen = lambda t: nn.Parameter(t, requires_grad=False)  # noqa: E731
    b = None if bias is None else frozen(bias)
    if fmt.startswith("int4"):
        path = fmt.partition(":")[2]
        if path != "generic" and path not in k.q4_paths():
            pytest.skip(f"this CPU has no {path} instructions")
        return Int4Linear(Int4Weights.of(weight, path), b, k)
    if fmt == "int8":
        scale = weight.abs().amax(1) / 127
        return Int8Linear(frozen((weight / scale[:, None]).round().to(torch.int8)), frozen(scale), b, None, k)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[fmt]
    return RowLinear(frozen(weight.to(dtype)), b, k)


def _attention(fmt: str, k, seed: int = 0) -> nn.Module:
    """q, k and v projections as a layer holds them (q with a bias, as Qwen2's have)."""
    g = torch.Generator().manual_seed(seed)
    layer = nn.Module()
    for name, n in zip(("q_proj", "k_proj", "v_proj"), OUTS, strict=True):
        setattr(layer, name, _linear(fmt, torch.randn(n, WIDTH, generator=g) * 0.05, torch.randn(n, generator=g), k))
    return layer


def _kernel_calls(monkeypatch) -> list:
    calls: list = []
    real = row_kernels._call

    def count(fn, *a):
        calls.append(fn)
        return real(fn, *a)

    monkeypatch.setattr(row_kernels, "_call", count)
    return calls


def _projections(layer: nn.Module, x: torch.Tensor, order=("q_proj", "k_proj", "v_proj")) -> dict:
    with torch.inference_mode():
        return {name: getattr(layer, name)(x) for name in order}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, PROMPT_ROWS - 1])  # a decoded token, and one with its draft
def test_siblings_decode_in_one_call_exactly_what_each_computes_alone(fmt, rows, kernels, monkeypatch):
    layer = _attention(fmt, kernels)
    x = torch.randn(1, rows, WIDTH, generator=torch.Generator().manual_seed(rows))
    alone = _projections(layer, x)
    assert share_inputs(layer, ()) == 1
    calls = _kernel_calls(monkeypatch)
    together = _projections(layer, x)
    assert len(calls) == 1  # one kernel call for the three
    for name, y in alone.items():
        assert torch.equal(together[name], y), name
        assert together[name].shape == (1, rows, getattr(layer, name).out_features)
    again = _projections(layer, x + 1)  # the next token: computed again, not the kept products
    assert len(calls) == 2
    assert not torch.equal(again["k_proj"], together["k_proj"])


@pytest.mark.parametrize("fmt", ["bf16", "int8", "int4:avx2"])
def test_the_siblings_hold_one_copy_of_their_weights(fmt, kernels):
    layer = _attention(fmt, kernels)
    before = tensor_bytes([*layer.parameters(), *layer.buffers()])
    share_inputs(layer, ())
    held = [m.nibbles if fmt == "int4:avx2" else m.weight for m in (layer.q_proj, layer.k_proj, layer.v_proj)]
    assert len({t.untyped_storage().data_ptr() for t in held}) == 1  # views of the one stack
    assert tensor_bytes([*layer.parameters(), *layer.buffers()]) == before  # what the Memory dock counts


@pytest.mark.parametrize("order", [("k_proj", "q_proj", "v_proj"), "two inputs"])
def test_a_layer_that_feeds_its_siblings_otherwise_gets_each_alone(order, kernels):
    layer = _attention("int8", kernels)
    x = torch.randn(1, 1, WIDTH, generator=torch.Generator().manual_seed(5))
    alone = _projections(layer, x)
    share_inputs(layer, ())
    if order == "two inputs":  # q of one tensor, k and v of an equal but other one
        with torch.inference_mode():
            got = {"q_proj": layer.q_proj(x), "k_proj": layer.k_proj(x.clone()), "v_proj": layer.v_proj(x.clone())}
    else:
        got = _projections(layer, x, order)
    assert not layer.q_proj.shared_input.on
    for name, y in alone.items():
        assert torch.equal(got[name], y), name


def test_int4_rows_side_by_side_are_left_alone(kernels):
    """The generic int4 layout interleaves output rows (no integer-dot instructions): not stacked."""
    layer = _attention("int4:generic", kernels)
    assert share_inputs(layer, ()) == 0 and layer.q_proj.shared_input is None


def test_a_loaded_model_groups_q_k_v_and_gate_up_of_every_layer(tiny_model, tmp_path, monkeypatch):
    from engine.model import calibrate, speed

    monkeypatch.setattr(calibrate, "MIN_PARAMS", 0)  # the tiny model follows its record like a real one
    model = tiny_model("qwen2_vl")
    shape = speed.LayerShape.of_config(json.loads((model / "config.json").read_text()))
    assert shape is not None
    speed.write(tmp_path, shape, [speed.FormatSpeed("int8", "float32", 4.0, 30.0, rows=True)])
    loaded = load_model(model, weights="int8", speed_dir=tmp_path)
    for layer in loaded.model.get_decoder().layers:
        attn, mlp = layer.self_attn, layer.mlp
        assert attn.q_proj.shared_input is attn.k_proj.shared_input is attn.v_proj.shared_input is not None
        assert mlp.gate_proj.shared_input is mlp.up_proj.shared_input is not None
        assert attn.o_proj.shared_input is None and mlp.down_proj.shared_input is None
    outside = tuple(v + "." for v in loaded.family.vision_modules)
    vision = [m for n, m in loaded.model.named_modules() if n.startswith(outside)]
    assert vision and not any(getattr(m, "shared_input", None) is not None for m in vision)
