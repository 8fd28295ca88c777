"""Build, check and pack the one-folder app (what `make bundle`, `make bundle-check` and
`make bundle-archive` run). Standard library only: it runs with the system python3.

    python3 packaging/bundle.py build   [--flavour auto|cpu|cuda]   -> dist/Parley
    python3 packaging/bundle.py check   [--flavour ...]   # a fresh build (reused when its inputs are
                                                          # unchanged), then `parley --self-check`
    python3 packaging/bundle.py archive [--flavour ...]   -> dist/Parley-<version>-<os>-<arch>-<flavour>.tar.gz

The bundle is built from a venv of its own, outside the clone and kept between builds (CI reuses
it): ~/.cache/parley-bundle/venv-<flavour>-<hash of requirements.txt and this recipe>, with
requirements.txt and PyInstaller installed. Flavours (Linux; elsewhere PyPI's torch is the only one):

- cuda: requirements.txt as it is (torch with its CUDA libraries: about 4.5 GB unpacked);
- cpu: a torch built without CUDA. First the pinned version from PyTorch's CPU index
  ($PARLEY_TORCH_CPU_INDEX); where that cannot be reached, the newest CPU-only torch that pip's own
  sources offer, with the pinned torchvision's Python code (its C++ ops are built for CUDA torch and
  cannot load: see `_torchvision_without_ops`). The choice is recorded in the venv's
  parley-bundle.json and printed with every build;
- auto (default): cuda where an NVIDIA GPU is present (Linux), else cpu.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIST = ROOT / "dist"
APP_DIR = DIST / "Parley"
WORK = ROOT / "build" / "pyinstaller"
STAMP = ROOT / "build" / "parley-bundle.json"
SPEC = ROOT / "packaging" / "parley.spec"
# the build tools, pinned so that a cached venv and a new one build the same bundle
BUILD_TOOLS = ["pyinstaller==6.22.3", "pyinstaller-hooks-contrib==2026.9"]
RECIPE = 1  # bump when the way the venv is made changes: a new venv is made
TORCH_CPU_INDEX = os.environ.get("PARLEY_TORCH_CPU_INDEX", "https://download.pytorch.org/whl/cpu")
# what a build reads: a change to any of these makes `check` build again
INPUTS = (
    "main.py",
    "app",
    "engine",
    "resources",
    "requirements.txt",
    "packaging/parley.spec",
    "packaging/bundle_contents.py",
)
CHECK_S = 900  # the self-check takes under a minute; this bounds a hang


def say(msg: str) -> None:
    print(f"bundle: {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ the build venv


def has_nvidia_gpu() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    if Path("/proc/driver/nvidia/gpus").is_dir() and any(Path("/proc/driver/nvidia/gpus").iterdir()):
        return True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        return subprocess.run([smi, "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def resolve_flavour(flavour: str) -> str:
    if flavour == "auto":
        return "cuda" if has_nvidia_gpu() else "cpu"
    return flavour


def cache_root() -> Path:
    if os.environ.get("PARLEY_BUNDLE_CACHE"):
        return Path(os.environ["PARLEY_BUNDLE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "parley-bundle"


def venv_dir(flavour: str) -> Path:
    h = hashlib.sha256()
    for part in (
        (ROOT / "requirements.txt").read_bytes(),
        flavour.encode(),
        f"{sys.version_info[:2]} {sys.platform} {platform.machine()}".encode(),
        " ".join(BUILD_TOOLS).encode(),
        f"recipe {RECIPE} {TORCH_CPU_INDEX}".encode(),
    ):
        h.update(hashlib.sha256(part).digest())
    return cache_root() / f"venv-{flavour}-{h.hexdigest()[:12]}"


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\s*(torch|torchvision)\s*==\s*([^\s;#]+)", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def _pip(py: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [str(py), "-m", "pip", "--disable-pip-version-check", *args]
    say(" ".join(cmd[3:]))
    return subprocess.run(cmd, check=check, text=True, stdout=sys.stderr)


def newest_cpu_torch(py: Path) -> str | None:
    """The newest `+cpu` torch version that pip's configured sources offer, or None."""
    out = subprocess.run(
        [str(py), "-m", "pip", "--disable-pip-version-check", "index", "versions", "torch"],
        capture_output=True,
        text=True,
    ).stdout
    m = re.search(r"Available versions:\s*(.*)", out)
    versions = [v.strip() for v in m.group(1).split(",")] if m else []
    cpu = [v for v in versions if v.endswith("+cpu")]
    return cpu[0] if cpu else None  # pip lists them newest first


STAND_IN = """

# Added by Parley's bundle build (packaging/bundle.py): this torchvision's C++ ops were built for a
# CUDA torch and cannot load into the CPU-only torch of this venv. Its image transforms (all that
# transformers' processors use) are Python; only the two ops whose fake kernels torchvision
# registers unconditionally need a schema for the import to succeed. Calling them would fail.
if not _has_ops():
    _parley_stand_in = torch.library.Library("torchvision", "DEF")
    _parley_stand_in.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _parley_stand_in.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
"""


def _imports(py: Path, module: str) -> bool:
    return subprocess.run([str(py), "-c", f"import {module}"], capture_output=True).returncode == 0


def _torchvision_without_ops(py: Path) -> None:
    """Make the pinned torchvision import on a torch it was not built for: stand-in schemas for its
    unguarded fake-kernel registrations (this venv only; never the project's .venv)."""
    if _imports(py, "torchvision"):
        return
    ext = subprocess.run(
        [str(py), "-c", "import importlib.util as u; print(u.find_spec('torchvision').submodule_search_locations[0])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    path = Path(ext) / "extension.py"
    text = path.read_text(encoding="utf-8")
    if "_parley_stand_in" not in text:
        path.write_text(text + STAND_IN, encoding="utf-8")
    if not _imports(py, "torchvision"):
        raise SystemExit(
            "bundle: torchvision does not import on this venv's CPU-only torch, even with stand-in schemas"
        )


def make_venv(flavour: str) -> Path:
    """The build venv for `flavour`, made once (a half-made one is made again) and reused."""
    venv = venv_dir(flavour)
    py = venv_python(venv)
    if (venv / ".complete").is_file() and py.exists():
        return venv
    if venv.exists():
        shutil.rmtree(venv)
    say(f"making the build venv {venv} (once; minutes)")
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    record: dict[str, str] = {"flavour": flavour}
    requirements = ROOT / "requirements.txt"
    if flavour == "cpu" and sys.platform.startswith("linux"):
        p = pins()
        wanted = [f"torch=={p['torch']}+cpu", f"torchvision=={p['torchvision']}+cpu"]
        got = _pip(
            py,
            "install",
            "-q",
            "--timeout",
            "20",
            "--retries",
            "1",
            "--index-url",
            TORCH_CPU_INDEX,
            *wanted,
            check=False,
        )
        if got.returncode == 0:
            record["torch_source"] = f"{' '.join(wanted)} from {TORCH_CPU_INDEX}"
        else:
            found = newest_cpu_torch(py)
            if found is None:
                raise SystemExit(
                    f"bundle: no CPU-only torch can be had: {TORCH_CPU_INDEX} cannot be reached and pip's "
                    "sources offer no +cpu build (set PARLEY_TORCH_CPU_INDEX, or build FLAVOUR=cuda)"
                )
            _pip(py, "install", "-q", f"torch=={found}")
            _pip(py, "install", "-q", "--no-deps", f"torchvision=={p['torchvision']}")
            record["torch_source"] = (
                f"torch=={found} (the pinned {p['torch']}+cpu is not reachable: {TORCH_CPU_INDEX}) and "
                f"torchvision=={p['torchvision']} without its C++ ops"
            )
            say(f"NOTE: {record['torch_source']}")
        torch_now = subprocess.run(
            [str(py), "-c", "import importlib.metadata as m; print(m.version('torch'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        rest = venv / "requirements-rest.txt"
        rest.write_text(
            "".join(
                line + "\n"
                for line in requirements.read_text(encoding="utf-8").splitlines()
                if not re.match(r"^\s*(torch|torchvision)\s*==", line)
            ),
            encoding="utf-8",
        )
        constraints = venv / "constraints.txt"
        constraints.write_text(f"torch=={torch_now}\n", encoding="utf-8")
        _pip(py, "install", "-q", "-r", str(rest), "-c", str(constraints), *BUILD_TOOLS)
        _torchvision_without_ops(py)
    else:
        _pip(py, "install", "-q", "-r", str(requirements), *BUILD_TOOLS)
        record["torch_source"] = "requirements.txt"
    record["torch"] = subprocess.run(
        [str(py), "-c", "import importlib.metadata as m; print(m.version('torch'))"], capture_output=True, text=True
    ).stdout.strip()
    (venv / "parley-bundle.json").write_text(json.dumps(record, indent=1), encoding="utf-8")
    (venv / ".complete").write_text("")
    for old in venv.parent.glob(f"venv-{flavour}-*"):  # superseded venvs of this flavour: gigabytes each
        if old != venv:
            shutil.rmtree(old, ignore_errors=True)
    return venv


# ------------------------------------------------------------------------------ build


def inputs_digest(venv: Path) -> str:
    h = hashlib.sha256(str(venv).encode())
    for entry in INPUTS:
        path = ROOT / entry
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for f in files:
            if "__pycache__" in f.parts or f.suffix == ".pyc":
                continue
            h.update(str(f.relative_to(ROOT)).encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def executable() -> Path:
    if sys.platform == "darwin":
        return DIST / "Parley.app" / "Contents" / "MacOS" / "Parley"
    return APP_DIR / ("Parley.exe" if sys.platform == "win32" else "parley")


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def build(flavour: str) -> dict:
    venv = make_venv(flavour)
    record = json.loads((venv / "parley-bundle.json").read_text(encoding="utf-8"))
    say(f"{flavour} flavour from {venv} (torch {record.get('torch')}: {record.get('torch_source')})")
    start = time.monotonic()
    env = {**os.environ, "PARLEY_BUNDLE_FLAVOUR": flavour}
    subprocess.run(
        [
            str(venv_python(venv)),
            "-m",
            "PyInstaller",
            "--noconfirm",
            "--clean",
            "--log-level",
            "WARN",
            "--distpath",
            str(DIST),
            "--workpath",
            str(WORK),
            str(SPEC),
        ],
        check=True,
        cwd=ROOT,
        env=env,
    )
    stamp = {
        **record,
        "venv": str(venv),
        "inputs": inputs_digest(venv),
        "build_s": round(time.monotonic() - start, 1),
        "unpacked_bytes": folder_bytes(APP_DIR),
    }
    STAMP.parent.mkdir(parents=True, exist_ok=True)
    STAMP.write_text(json.dumps(stamp, indent=1), encoding="utf-8")
    say(f"built {APP_DIR} in {stamp['build_s']:.0f} s: {stamp['unpacked_bytes'] / 2**30:.2f} GiB unpacked")
    return stamp


def fresh_build(flavour: str) -> dict:
    """The build in dist/, made again unless its inputs (code, resources, spec, venv) are unchanged."""
    venv = venv_dir(flavour)
    try:
        stamp = json.loads(STAMP.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        stamp = {}
    if (
        stamp.get("venv") == str(venv)
        and (venv / ".complete").is_file()
        and executable().is_file()
        and stamp.get("inputs") == inputs_digest(venv)
    ):
        say(f"reusing {APP_DIR} (built from these inputs with {venv.name})")
        return stamp
    return build(flavour)


# ------------------------------------------------------------------------------ check, archive


def check(flavour: str) -> int:
    fresh_build(flavour)
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HF_HUB_OFFLINE": "1"}
    cmd = [str(executable()), "--self-check"]
    say(" ".join(cmd))
    start = time.monotonic()
    try:
        rc = subprocess.run(cmd, env=env, timeout=CHECK_S).returncode
    except subprocess.TimeoutExpired:
        say(f"the bundle's self-check did not end within {CHECK_S} s")
        return 1
    say(f"the bundle's self-check {'passed' if rc == 0 else f'FAILED (exit {rc})'} in {time.monotonic() - start:.0f} s")
    return rc


def archive(flavour: str) -> Path:
    stamp = fresh_build(flavour)
    version = re.search(r'VERSION\s*=\s*"([^"]+)"', (ROOT / "app" / "version.py").read_text(encoding="utf-8"))
    name = f"Parley-{version.group(1) if version else '0'}-{sys.platform}-{platform.machine()}-{flavour}"
    if not sys.platform.startswith("linux"):
        raise SystemExit("bundle: `archive` packs the Linux folder; on macOS/Windows ship dist/ as built")
    out = DIST / f"{name}.tar.gz"
    tmp = out.with_suffix(".tmp")
    start = time.monotonic()
    say(f"packing {out.name} (gzip)")
    with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
        tar.add(APP_DIR, arcname="Parley")
        tar.add(ROOT / "packaging" / "linux" / "install_desktop.py", arcname="Parley/install-desktop.py")
        tar.add(ROOT / "packaging" / "linux" / "parley.desktop", arcname="Parley/parley.desktop")
    os.replace(tmp, out)
    size = out.stat().st_size
    say(
        f"{out}: {size / 2**20:.0f} MiB ({stamp['unpacked_bytes'] / 2**30:.2f} GiB unpacked), packed in "
        f"{time.monotonic() - start:.0f} s. Unpack anywhere; Parley/parley starts it, "
        "`python3 Parley/install-desktop.py install` adds it to the desktop's menu"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("venv", "build", "check", "archive"))
    parser.add_argument("--flavour", choices=("auto", "cpu", "cuda"), default="auto")
    args = parser.parse_args(argv)
    flavour = resolve_flavour(args.flavour)
    if args.action == "venv":
        print(make_venv(flavour))
    elif args.action == "build":
        build(flavour)
    elif args.action == "check":
        return check(flavour)
    else:
        archive(flavour)
    return 0


if __name__ == "__main__":
    sys.exit(main())
