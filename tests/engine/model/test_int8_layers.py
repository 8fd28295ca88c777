"""engine/model/int8_layers.py: the int8 linear and embedding compute exactly what their own int8
values and scales say; a decoded row's result does not depend on the rows of its draft, and a
prompt chunk (the int8 GEMM where it is exact, else the dequantized GEMM) computes the same
weights within rounding."""

from __future__ import annotations

import pytest
import torch

from engine.local.lookup_decode import NgramDrafter
from engine.model import int8_layers
from engine.model.int8_layers import Int8Embedding, Int8Linear
from engine.model.prompt_rows import PROMPT_ROWS


def _layer(rows: int, cols: int, dtype: torch.dtype, bias: bool = False) -> Int8Linear:
    g = torch.Generator().manual_seed(rows * 1000 + cols)
    weight = torch.randint(-127, 128, (rows, cols), dtype=torch.int8, generator=g)
    scale = (torch.rand(rows, generator=g) * 0.01 + 1e-3).to(dtype)
    b = torch.randn(rows, generator=g).to(dtype) if bias else None
    frozen = lambda t: None if t is None else torch.nn.Parameter(t, requires_grad=False)  # noqa: E731
    return Int8Linear(frozen(weight), frozen(scale), frozen(b))


def _exact(layer: Int8Linear, x: torch.Tensor) -> torch.Tensor:
    w = layer.weight.double() * layer.scale.double()[:, None]
    y = x.double() @ w.T
    return y if layer.bias is None else y + layer.bias.double()


# widths where torch 2.14.1's bf16 int8 kernel goes wrong or crashes on some CPU: not a multiple of
# 8 (AVX2), a multiple of 8 but not of 16 (8, 24: AVX-512); the layer must be right at all of them
@pytest.mark.parametrize("cols", [8, 24, 37, 64, 100, 1536])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_linear_computes_its_own_weights(dtype, cols):
    layer = _layer(53, cols, dtype, bias=True)
    x = torch.randn(2, 5, cols).to(dtype)
    with torch.inference_mode():
        y = layer(x)
    assert y.shape == (2, 5, 53) and y.dtype == dtype
    ref = _exact(layer, x)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert (y.double() - ref).abs().max() <= tol * ref.abs().max(), (dtype, cols)


def test_an_fp32_layer_decodes_its_rows_in_bf16_and_its_prompts_in_fp32():
    """With decode_scale (an fp32 model on a CPU where bf16 rows run 6x faster through the
    one-row kernel): a decoded row is its bf16-rounded input times the int8 weights, returned in
    fp32; a prompt chunk is exactly what the fp32 layer computes."""
    layer = _layer(8960, 1536, torch.float32, bias=True)
    rows = Int8Linear(layer.weight, layer.scale, layer.bias, torch.nn.Parameter(layer.scale.to(torch.bfloat16)))
    one, many = torch.randn(1, 1536), torch.randn(3 * PROMPT_ROWS, 1536)
    with torch.inference_mode():
        y, prompt = rows(one), rows(many)
        assert torch.equal(prompt, layer(many))
    assert y.dtype == prompt.dtype == torch.float32
    ref = _exact(layer, one.bfloat16())
    assert (y.double() - ref).abs().max() <= 2e-2 * ref.abs().max()
    assert "decoded rows in torch.bfloat16" in repr(rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_decoded_row_is_the_same_alone_or_with_its_draft(dtype):
    layer = _layer(8960, 1536, dtype)
    x = torch.randn(PROMPT_ROWS - 1, 1536).to(dtype)  # the longest decode step: a token and its draft
    with torch.inference_mode():
        whole = layer(x)
        one_by_one = torch.cat([layer(x[i : i + 1]) for i in range(len(x))])
        split = torch.cat([layer(x[:6]), layer(x[6:])])
    assert torch.equal(whole, one_by_one) and torch.equal(whole, split)


def test_the_longest_draft_stays_on_the_decode_kernel():
    assert 1 + NgramDrafter([]).max_draft < PROMPT_ROWS  # the runner uses the default cap


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_prompt_chunk_computes_its_own_weights_in_slices(dtype, monkeypatch):
    """Where the int8 GEMM is not exact or not fast (AVX2), a prompt chunk goes through the dequantized GEMM,
    a slice of output rows at a time (a fixed slicing per layer): the same weights as the one-row
    kernel, within the compute dtype's rounding, however it is sliced."""
    monkeypatch.setattr(int8_layers, "int8_gemm_used", lambda: False)
    layer = _layer(8960, 1536, dtype)
    x = torch.randn(3 * PROMPT_ROWS, 1536).to(dtype)
    ref = _exact(layer, x)
    with torch.inference_mode():
        whole = layer(x)
        monkeypatch.setattr(int8_layers, "DEQUANTIZED_BYTES", 1536 * 1000 * x.element_size())  # 9 slices
        sliced = layer(x)
        rows = torch.cat([layer(x[i : i + 1]) for i in range(len(x))])
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for got in (whole, sliced, rows):
        assert (got.double() - ref).abs().max() <= tol * ref.abs().max()


def _int8_activations(x: torch.Tensor) -> torch.Tensor:
    """x as the int8 GEMM sees it: outlier columns as they are, every other value rounded to a
    multiple of its row's amax / 127."""
    x = x.double()
    column_max = x.abs().amax(0)
    outliers = column_max > int8_layers.OUTLIER * column_max.float().median().double()
    rest = x.masked_fill(outliers, 0)
    scale = rest.abs().amax(1, keepdim=True).float().div(127).double()
    return torch.where(outliers, x, (rest / scale).round() * scale)


needs_int8_gemm = pytest.mark.skipif(
    not int8_layers.int8_gemm_exact(),
    reason="this CPU's int8 GEMM is not exact (no VNNI): prompts take the dequantized GEMM",
)  # its arithmetic is checked wherever it is exact, fast or not: the products call it directly


@needs_int8_gemm
@pytest.mark.parametrize("outlier_columns", [0, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_prompt_chunk_through_the_int8_gemm_computes_its_int8_activations(dtype, outlier_columns):
    """The int8 GEMM multiplies each row quantized with its own scale exactly (int32 sums), and
    stays within activation rounding of the exact product; outlier columns (here 40x the rest, as
    a real model's few large channels) are kept out of the row's scale."""
    layer = _layer(8960, 1536, dtype, bias=True)
    g = torch.Generator().manual_seed(outlier_columns)
    x = torch.randn(3 * PROMPT_ROWS, 1536, generator=g)
    x[:, torch.randperm(1536, generator=g)[:outlier_columns]] *= 40
    x = x.to(dtype)
    with torch.inference_mode():
        y = layer._int8_product(x)
    assert y.dtype == dtype
    said = _exact(layer, _int8_activations(x))
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert (y.double() - said).abs().max() <= tol * said.abs().max()
    ref = _exact(layer, x)
    assert (y.double() - ref).pow(2).mean().sqrt() <= 0.015 * ref.pow(2).mean().sqrt()


@needs_int8_gemm
def test_a_chunk_of_mostly_outliers_takes_the_dequantized_gemm():
    layer = _layer(64, 256, torch.float32)
    x = torch.randn(PROMPT_ROWS, 256)
    x[:, :64] *= 100  # a quarter of the columns: past MAX_OUTLIERS
    with torch.inference_mode():
        assert torch.equal(layer._int8_product(x), layer._dequantized_product(x))


def test_the_kv_namespace_names_the_prompt_kernel(monkeypatch):
    assert int8_layers.layout().endswith("int8-gemm" if int8_layers.int8_gemm_used() else "dequantized")
    monkeypatch.setattr(int8_layers, "int8_gemm_used", lambda: False)
    assert int8_layers.layout() == f"{int8_layers.LAYOUT};prompt=dequantized"


def test_int8_embedding_scales_back_the_rows_it_looks_up():
    table = _layer(50, 16, torch.bfloat16)
    embedding = Int8Embedding(table.weight, table.scale)
    ids = torch.tensor([[3, 0, 49, 3]])
    out = embedding(ids)
    assert out.shape == (1, 4, 16) and out.dtype == torch.bfloat16
    expected = (table.weight[ids].double() * table.scale[ids].double().unsqueeze(-1)).to(torch.bfloat16)
    assert torch.equal(out, expected)
    assert torch.equal(embedding(torch.tensor(49)), out[0, 2])  # a 0-d id, as Qwen2-VL looks up its image token
