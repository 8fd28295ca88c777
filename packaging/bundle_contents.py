"""What the bundle must carry, derived from requirements.txt and the code's own imports, so that a new
dependency cannot be forgotten (packaging/parley.spec asks this module; tests/packaging/test_bundle_contents.py
checks the checkout against it).

- Every import statement in main.py, app/ and engine/ (also those inside functions: a command or a
  room imported late is still shipped) names a module; each one outside the standard library must
  come from a distribution that requirements.txt asks for, directly or through its dependencies.
  One that does not is a build error naming the file.
- Nothing the code imports may be on the exclude list (the bundle once died at start on
  `No module named 'av'`, excluded from before PyAV was a dependency).
- hidden imports: every module of app/ and engine/ and every module the code names, so that an
  import PyInstaller's analysis cannot follow (a late one, a string) is still there.
- native libraries: every shared library that the required distributions install (PDFium, FFmpeg
  in PyAV's wheel, LLVM in llvmlite, torchvision's ops), which are often opened with ctypes where
  the analysis does not see them; and every distribution's metadata, which transformers and
  Help ▸ About read at run time.

Standard library only (it runs in the bundle's build venv, where PyInstaller is).
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = ("main.py", "app", "engine")
LOCAL = {"main", "app", "engine", "tests", "packaging", "__future__"}

# Never shipped: what Parley does not run and is large, test and build tools, Qt modules the window
# does not use. Listed by module; `check` refuses a build where the code imports one of them.
EXCLUDES = [
    # torch's GPU compiler (torch imports it only for torch.compile on a GPU, which Parley does not use)
    "triton",
    "torch.utils.tensorboard",
    "tensorboard",
    "tkinter",
    "_tkinter",
    "matplotlib",
    "IPython",
    "jupyter_client",
    "notebook",
    "pandas",
    "scipy",
    "sklearn",
    "tensorflow",
    "jax",
    "flax",
    "onnx",
    "onnxruntime",
    "cv2",
    # test and build tools
    "pytest",
    "_pytest",
    "pytestqt",
    "pytest_timeout",
    "PyInstaller",
    "pip",
    # Qt modules Parley does not use (the window needs QtCore/Gui/Widgets/Svg/Network)
    "PySide6.QtQml",
    "PySide6.QtQuick",
    "PySide6.QtQuickWidgets",
    "PySide6.QtOpenGLWidgets",
    "PySide6.QtSql",
    "PySide6.QtTest",
    "PySide6.QtDBus",
    "PySide6.QtConcurrent",
    "PySide6.QtPrintSupport",
    "PySide6.QtDesigner",
    "PySide6.QtUiTools",
    "PySide6.QtHelp",
]
# distributions whose files are never shipped, whatever depends on them (see EXCLUDES)
EXCLUDED_DISTS = {"triton"}

# transformers loads a model's classes by name at run time: the families of engine/model/families.py,
# the backbones their default configs name, and these backbones that released checkpoints of those
# families use instead (LLaVA-1.5 on Vicuna = llama, LLaVA-NeXT on Mistral, PaliGemma-style Gemma)
EXTRA_BACKBONES = ["llama", "mistral", "qwen2", "gemma", "clip", "siglip"]

_NATIVE = re.compile(r"\.(so(\.\d+)*|dylib|dll|pyd)$")
# the suffixes that mark a Python extension module for sure (a plain .so may be either)
_EXTENSION = tuple(s for s in importlib.machinery.EXTENSION_SUFFIXES if s not in (".so", ".pyd"))
# distributions whose PyInstaller hooks collect exactly the native files used (Qt: the modules and
# plugins the window imports, not Qt Quick or Designer); the rest ship every library they install
NATIVE_BY_HOOK = {"pyside6-essentials", "shiboken6"}
# with a torch built without CUDA, libraries for CUDA cannot be called: bitsandbytes' per-CUDA
# kernels (125 MB), torchvision's nvjpeg and cudart. By the start of the name: ICU's libicudata
# contains "cuda" and is Qt's.
_CUDA_LIB = re.compile(r"^lib(cuda|cudart|nvjpeg|cublas|cudnn|nccl|nvrtc|bitsandbytes_cuda)", re.IGNORECASE)
_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def code_files(root: Path = ROOT) -> list[Path]:
    files: list[Path] = []
    for entry in CODE:
        path = root / entry
        files += [path] if path.is_file() else sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)
    return files


def imports_of(path: Path) -> set[str]:
    """Every absolute module name an import statement in `path` names (from X import Y: X and X.Y,
    since Y may be a submodule)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def external_imports(root: Path = ROOT, stdlib: bool = False) -> dict[str, set[Path]]:
    """Module name -> the files that import it, for every module outside the project (and outside
    the standard library unless `stdlib`)."""
    found: dict[str, set[Path]] = {}
    for path in code_files(root):
        for name in imports_of(path):
            top = name.split(".")[0]
            if top in LOCAL or (not stdlib and top in sys.stdlib_module_names):
                continue
            found.setdefault(name, set()).add(path.relative_to(root))
    return found


def project_modules(root: Path = ROOT) -> list[str]:
    """Every module of app/ and engine/ (and main), by dotted name."""
    names = []
    for path in code_files(root):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(parts))
    return sorted(names)


def requirement_names(path: Path = ROOT / "requirements.txt") -> list[str]:
    names = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        m = _REQ_NAME.match(line)
        if m and _marker_holds(line):  # tbb: Linux and Windows on x86-64 only
            names.append(m.group(1))
    return names


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _marker_holds(requirement: str) -> bool:
    """A dependency's environment marker, evaluated for this interpreter well enough to follow
    the dependency graph: an `extra ==` marker is never followed (extras are not installed)."""
    if ";" not in requirement:
        return True
    marker = requirement.split(";", 1)[1]
    if "extra" in marker:
        return False
    try:
        from packaging.markers import Marker  # pip's vendored copy is not importable; this may be absent

        return Marker(marker).evaluate()
    except Exception:  # noqa: BLE001 - without a marker parser, follow it if the distribution is there
        return True


def required_distributions(roots: Iterable[str]) -> dict[str, metadata.Distribution]:
    """The installed distributions `roots` need, with everything they depend on (canonical name ->
    distribution). A root that is not installed is an error: the build venv is incomplete."""
    out: dict[str, metadata.Distribution] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        key = _canonical(name)
        if key in out or key in EXCLUDED_DISTS:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            if name in roots:
                raise SystemExit(f"bundle: {name} (requirements.txt) is not installed in {sys.prefix}") from None
            continue  # an optional dependency this platform does not install
        out[key] = dist
        for req in dist.requires or []:
            if _marker_holds(req):
                m = _REQ_NAME.match(req)
                if m:
                    todo.append(m.group(1))
    return out


def top_level_modules(dist: metadata.Distribution) -> set[str]:
    """The importable top-level names a distribution installs (from its file list)."""
    tops = set()
    for f in dist.files or []:
        parts = f.parts
        if not parts or parts[0].endswith((".dist-info", ".egg-info", ".data")) or parts[0] == "..":
            continue
        first = parts[0]
        if len(parts) == 1:
            if first.endswith(".py"):
                tops.add(first[:-3])
            elif any(first.endswith(s) for s in importlib.machinery.EXTENSION_SUFFIXES):
                tops.add(first.split(".")[0])
        elif not first.endswith(".libs"):
            tops.add(first)
    return tops


def torch_has_cuda() -> bool:
    """Whether the installed torch is a CUDA build (Linux/Windows wheels without +cpu)."""
    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return False
    return "+cpu" not in version and sys.platform != "darwin"


def native_libraries(dists: Iterable[metadata.Distribution], cuda: bool = True) -> list[tuple[str, str]]:
    """(source file, folder in the bundle) for every shared library the distributions install,
    except Python extension modules (the analysis collects those it sees imported), and except
    CUDA libraries when `cuda` is False."""
    out = []
    for dist in dists:
        if _canonical(dist.metadata["Name"]) in NATIVE_BY_HOOK:
            continue
        for f in dist.files or []:
            name = f.name
            if not _NATIVE.search(name) or name.endswith(_EXTENSION):
                continue
            if not cuda and _CUDA_LIB.search(name):
                continue
            if f.parts[0] == "..":
                continue
            src = Path(str(dist.locate_file(f)))
            if src.is_file():
                out.append((str(src), str(Path(*f.parts[:-1])) if len(f.parts) > 1 else "."))
    return sorted(set(out))


def model_packages() -> list[str]:
    """transformers.models.<name> packages the supported families need (engine/model/families.py
    names the model types; their default configs name the text and vision backbones)."""
    sys.path.insert(0, str(ROOT))
    try:
        from engine.model.families import FAMILIES  # torch-free: the family table only
    finally:
        sys.path.remove(str(ROOT))
    from transformers import CONFIG_MAPPING

    names = set(EXTRA_BACKBONES) | {"auto"}
    for model_type in FAMILIES:
        names.add(model_type)
        config = CONFIG_MAPPING[model_type]()
        for sub in ("text_config", "vision_config"):
            part = getattr(config, sub, None)
            if part is not None and getattr(part, "model_type", None):
                names.add(part.model_type.replace("-", "_"))
    from transformers.models import auto

    models_dir = Path(auto.__file__).resolve().parents[1]
    # a sub-config's model_type (qwen2_vl_text) lives in its family's package: keep real packages
    return sorted(n for n in names if (models_dir / n).is_dir())


# files that hooks collect and Parley never runs: libtorch's C++ test programs and protoc (133 MB);
# torch/bin/torch_shm_manager stays (torch's import looks for it)
_NEVER_RUN = re.compile(r"^torch/bin/(?!torch_shm_manager$)|^torch/test/|^torch/lib/lib\w*_test\.so$")


def dropped(dest: str, cuda: bool) -> bool:
    """Whether a file the analysis and hooks collected (by its path in the bundle) stays out: a
    test program, or a CUDA library in a bundle whose torch has no CUDA (bitsandbytes' hook takes
    all its per-CUDA kernels, torchvision's its nvjpeg)."""
    dest = dest.replace("\\", "/")
    return bool(_NEVER_RUN.search(dest)) or (not cuda and bool(_CUDA_LIB.search(Path(dest).name)))


@dataclass
class Contents:
    hiddenimports: list[str] = field(default_factory=list)
    binaries: list[tuple[str, str]] = field(default_factory=list)
    distributions: list[str] = field(default_factory=list)  # their metadata goes in
    excludes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def check(root: Path = ROOT) -> tuple[dict[str, metadata.Distribution], list[str]]:
    """The required distributions, and every import that the bundle could not satisfy."""
    dists = required_distributions(requirement_names(root / "requirements.txt"))
    provided: dict[str, str] = {}
    for key, dist in dists.items():
        for top in top_level_modules(dist):
            provided.setdefault(top, key)
    problems = []
    for name, files in sorted(external_imports(root, stdlib=True).items()):
        where = ", ".join(sorted(str(f) for f in files))
        top = name.split(".")[0]
        if top not in sys.stdlib_module_names and top not in provided:
            problems.append(
                f"{where} imports {name}, which no distribution in requirements.txt (or what those "
                f"depend on) installs: add it to requirements.txt"
            )
        for ex in EXCLUDES:
            if name == ex or name.startswith(ex + ".") or top == ex:
                problems.append(f"{where} imports {name}, but the bundle excludes {ex} (bundle_contents.EXCLUDES)")
    return dists, problems


def contents(root: Path = ROOT) -> Contents:
    dists, problems = check(root)
    imported = sorted(external_imports(root))
    hidden = [m for m in project_modules(root) if m != "main"] + [n for n in imported if _importable(n)]
    hidden += [f"transformers.models.{n}" for n in model_packages()]
    return Contents(
        hiddenimports=hidden,
        binaries=native_libraries(dists.values(), cuda=torch_has_cuda()),
        distributions=sorted(d.metadata["Name"] for d in dists.values()),
        excludes=list(EXCLUDES),
        problems=problems,
    )


def _importable(name: str) -> bool:
    """`from X import Y` names X.Y, which is a module only sometimes."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError, AttributeError):
        return False


if __name__ == "__main__":
    c = contents()
    print(f"{len(c.hiddenimports)} hidden imports, {len(c.binaries)} native libraries, {len(c.distributions)} dists")
    for p in c.problems:
        print("problem:", p)
    sys.exit(1 if c.problems else 0)
