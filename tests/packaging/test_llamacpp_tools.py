"""The llama.cpp build the benchmarks share (tests/bench/_llamacpp.py): a build from before a tool
joined it still serves the benchmarks that need only what it has, and a benchmark that needs the
missing tool gets the one line that says how to add it (the suite never builds: `make bench-tools`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def llamacpp(tmp_path, monkeypatch):
    monkeypatch.setenv("PARLEY_BENCH_CACHE", str(tmp_path))
    sys.path.insert(0, str(BENCH_DIR))
    try:
        import _llamacpp
    finally:
        sys.path.remove(str(BENCH_DIR))
    return _llamacpp


def _built(root: Path, tools: list[str]) -> None:
    """A cache folder as a finished build leaves it: built.json and the tools it linked."""
    (root / "build" / "bin").mkdir(parents=True)
    for t in tools:
        (root / "build" / "bin" / t).write_bytes(b"")
    (root / "built.json").write_text(json.dumps({"llama_cpp_python": "0.3.36", "build_s": 535}))


def test_an_older_build_serves_what_it_has_and_names_what_it_lacks(llamacpp):
    root = llamacpp.cache_root()
    _built(root, ["llama-bench", "llama-mtmd-cli", "llama-quantize"])  # before llama-server joined
    older = llamacpp.ensure(build=False, need=("llama-bench", "llama-mtmd-cli", "llama-quantize"))
    assert older.root == root
    with pytest.raises(llamacpp.Unavailable, match=r"^llama-server not built on this machine: `make bench-tools`"):
        llamacpp.ensure(build=False, need=("llama-server",))
    (root / "build" / "bin" / "llama-server").write_bytes(b"")
    assert llamacpp.ensure(build=False, need=("llama-server",)).tool("llama-server").exists()


def test_nothing_built_is_one_line(llamacpp):
    with pytest.raises(llamacpp.Unavailable, match=r"^llama\.cpp is not built on this machine"):
        llamacpp.ensure(build=False)
