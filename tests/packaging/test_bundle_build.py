"""packaging/bundle.py: `make bundle-check` reuses a build only while everything it was built from is
unchanged, and each flavour and requirements.txt get a build venv of their own."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "packaging"))

import bundle  # noqa: E402


def _tree(tmp_path: Path, monkeypatch) -> Path:
    root = tmp_path / "checkout"
    for entry in bundle.INPUTS:
        path = root / entry
        if "." in Path(entry).name:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{entry}\n")
        else:
            (path / "sub").mkdir(parents=True)
            (path / "sub" / "x.py").write_text("x = 1\n")
    monkeypatch.setattr(bundle, "ROOT", root)
    return root


def test_a_changed_input_makes_the_build_stale(tmp_path, monkeypatch):
    root = _tree(tmp_path, monkeypatch)
    venv = tmp_path / "venv-cpu-abc"
    before = bundle.inputs_digest(venv)
    (root / "engine" / "sub" / "__pycache__").mkdir()
    (root / "engine" / "sub" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    assert bundle.inputs_digest(venv) == before  # a compiled file is not an input
    (root / "resources" / "sub" / "x.py").write_text("x = 2\n")
    assert bundle.inputs_digest(venv) != before
    (root / "resources" / "sub" / "x.py").write_text("x = 1\n")
    assert bundle.inputs_digest(venv) == before
    assert bundle.inputs_digest(tmp_path / "venv-cuda-abc") != before  # another venv: another build


def test_each_flavour_and_requirements_get_their_own_venv(tmp_path, monkeypatch):
    monkeypatch.setenv("PARLEY_BUNDLE_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "checkout"
    root.mkdir()
    shutil.copyfile(ROOT / "requirements.txt", root / "requirements.txt")
    monkeypatch.setattr(bundle, "ROOT", root)
    cpu, cuda = bundle.venv_dir("cpu"), bundle.venv_dir("cuda")
    assert cpu.parent == cuda.parent == tmp_path / "cache"
    assert cpu.name.startswith("venv-cpu-") and cuda.name.startswith("venv-cuda-")
    assert bundle.venv_dir("cpu") == cpu
    (root / "requirements.txt").write_text((ROOT / "requirements.txt").read_text() + "newdep==1.0\n")
    assert bundle.venv_dir("cpu") != cpu
    assert set(bundle.pins()) == {"torch", "torchvision"}
