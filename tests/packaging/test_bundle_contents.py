"""What the bundle carries is derived from requirements.txt and the code's imports
(packaging/bundle_contents.py, read by packaging/parley.spec): the checkout passes its check, and a
new import that requirements.txt does not provide, or that the bundle excludes, is named with its
file before any build starts. `make bundle-check` then proves the real bundle."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "packaging"))

import bundle_contents  # noqa: E402


def test_the_checkout_imports_only_what_requirements_provide():
    dists, problems = bundle_contents.check(ROOT)
    assert problems == []
    assert {"av", "pypdfium2", "numba", "llvmlite", "torch", "pyside6-essentials"} <= set(dists)


def _project(tmp_path: Path, source: str) -> Path:
    root = tmp_path / "checkout"
    (root / "app").mkdir(parents=True)
    (root / "engine" / "pictures").mkdir(parents=True)
    shutil.copyfile(ROOT / "requirements.txt", root / "requirements.txt")
    (root / "main.py").write_text("import app\n")
    (root / "app" / "__init__.py").write_text("")
    (root / "engine" / "__init__.py").write_text("")
    (root / "engine" / "pictures" / "__init__.py").write_text("")
    (root / "engine" / "pictures" / "video.py").write_text(source)
    return root


def test_an_import_no_requirement_provides_is_named(tmp_path):
    root = _project(tmp_path, "def frames():\n    import parley_unlisted_codec\n")  # late imports count too
    _, problems = bundle_contents.check(root)
    assert len(problems) == 1
    assert problems[0].startswith("engine/pictures/video.py imports parley_unlisted_codec, which no distribution")


def test_an_excluded_import_is_refused(tmp_path, monkeypatch):
    """The bundle that died on `No module named 'av'`: av was on the exclude list."""
    monkeypatch.setattr(bundle_contents, "EXCLUDES", [*bundle_contents.EXCLUDES, "av"])
    _, problems = bundle_contents.check(_project(tmp_path, "import av\n"))
    assert problems == ["engine/pictures/video.py imports av, but the bundle excludes av (bundle_contents.EXCLUDES)"]


def test_native_libraries_of_pdfium_ffmpeg_and_llvm_are_shipped():
    dists, _ = bundle_contents.check(ROOT)
    names = {Path(src).name for src, _ in bundle_contents.native_libraries(dists.values())}
    for prefix in ("libpdfium", "libavcodec", "libllvmlite"):
        assert any(n.startswith(prefix) for n in names), prefix
    cpu_only = {Path(src).name for src, _ in bundle_contents.native_libraries(dists.values(), cuda=False)}
    assert not any(n.startswith(("libbitsandbytes_cuda", "libcudart", "libnvjpeg")) for n in cpu_only)
    assert any(n.startswith("libpdfium") for n in cpu_only)


def test_every_module_of_app_and_engine_is_a_hidden_import():
    modules = bundle_contents.project_modules(ROOT)
    assert "engine.pictures.video" in modules and "app.shell.self_check" in modules and "app" in modules
    on_disk = [p for d in ("app", "engine") for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts]
    assert len(modules) == len(on_disk) + 1  # + main


def test_test_programs_and_unusable_cuda_libraries_stay_out():
    never = ["torch/bin/protoc", "torch/test/cpu_generator_test", "torch/lib/libtorchbind_test.so"]
    assert all(bundle_contents.dropped(d, cuda=True) for d in never)
    cuda_only = ["bitsandbytes/libbitsandbytes_cuda128.so", "torchvision.libs/libnvjpeg.36e11081.so.13"]
    assert all(bundle_contents.dropped(d, cuda=False) and not bundle_contents.dropped(d, cuda=True) for d in cuda_only)
    kept = ["torch/lib/libtorch_cpu.so", "bitsandbytes/libbitsandbytes_cpu.so", "pypdfium2_raw/libpdfium.so"]
    kept += ["PySide6/Qt/lib/libicudata.so.73", "torch/bin/torch_shm_manager"]  # a self-check found both missing
    assert not any(bundle_contents.dropped(d, cuda=False) for d in kept)
