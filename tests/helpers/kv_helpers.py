"""Made-up KV caches and a small store for the KV block store tests: seeded K/V tensors (grown
like a conversation), token lists, the exact-prefix check, and the blobs on disk."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from engine.kvstore import KVStore

NS = b"test-model:v1"


def make_kv(n, layers=3, kv_heads=2, head_dim=16, dtype=torch.float32, seed=0, v_dim=None):
    g = torch.Generator().manual_seed(seed)
    v_dim = v_dim or head_dim
    return [
        (
            torch.randn(1, kv_heads, n, head_dim, generator=g).to(dtype),
            torch.randn(1, kv_heads, n, v_dim, generator=g).to(dtype),
        )
        for _ in range(layers)
    ]


def grow(kv, extra, seed):
    """The same conversation k tokens later: old K/V unchanged, new ones appended."""
    new = make_kv(extra, len(kv), kv[0][0].shape[1], kv[0][0].shape[3], kv[0][0].dtype, seed, kv[0][1].shape[3])
    return [(torch.cat([k, nk], 2), torch.cat([v, nv], 2)) for (k, v), (nk, nv) in zip(kv, new, strict=True)]


def cache_of(kv):
    return DynamicCache(ddp_cache_data=kv)


def tokens(n, seed=0):
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randint(0, 150_000, (n,), generator=g).tolist()


def assert_prefix(result, kv, n):
    assert result.n_tokens == n
    if n == 0:
        assert result.cache is None
        return
    assert len(result.cache.layers) == len(kv)
    for layer, (k, v) in zip(result.cache.layers, kv, strict=True):
        assert type(layer) is DynamicLayer
        assert torch.equal(layer.keys, k[:, :, :n]) and torch.equal(layer.values, v[:, :, :n])
    assert result.cache.get_seq_length() == n


def blob_files(root):
    out = {}
    for dirpath, _, names in os.walk(os.path.join(root, "blobs")):
        for name in names:
            with open(os.path.join(dirpath, name), "rb") as f:
                out[name] = f.read()
    return out


@pytest.fixture
def store(tmp_path):
    s = KVStore(str(tmp_path / "kv"), NS, block_tokens=16, unit_bytes=8192, min_free_bytes=0)
    yield s
    s.close()
