"""The KV-store, spill and history suites as Windows and macOS would run them, and every module
of the project importable there (tests/helpers/platform_sim.py says what is simulated and what cannot be).

Each case is a child pytest / Python with PARLEY_SIMULATE_PLATFORM set; the crash tests inside
(SIGKILL during spills, SIGKILL mid-reply) start their writers under the same simulation.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import platform_sim

REPO = Path(__file__).resolve().parents[3]
# the store, spill and history modules (not the model-heavy ones: the suite has a time budget)
SUITES = [
    "tests/engine/kvstore/test_kvstore.py",
    "tests/engine/kvstore/test_kvstore_recovery.py",
    "tests/engine/kvstore/test_kvstore_faults.py",
    "tests/engine/kvstore/test_kvstore_api.py",
    "tests/app/history/test_history.py",
    "tests/engine/platform/test_platform_io.py",
]
KINDS = sorted(platform_sim.MISSING)

pytestmark = [
    pytest.mark.skipif(bool(os.environ.get(platform_sim.ENV)), reason="already inside a simulation"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="simulates other OSes on Linux"),
]


def _env(kind: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != platform_sim.ENV}
    env["QT_QPA_PLATFORM"] = "offscreen"
    if kind:
        env[platform_sim.ENV] = kind
        env["PYTHONPATH"] = os.pathsep.join([platform_sim.BOOT_DIR, str(REPO)])
    return env


@pytest.mark.parametrize("kind", KINDS)
def test_store_spill_and_history_suites_pass_as(kind):
    # default verbosity: the header says which simulation ran (-q would drop it)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-p", "no:cacheprovider", *SUITES],
        cwd=REPO,
        env=_env(kind),
        capture_output=True,
        text=True,
        timeout=900,
    )
    tail = out.stdout[-4000:] + out.stderr[-2000:]
    assert f"parley platform simulation: {kind}" in out.stdout, tail
    assert out.returncode == 0, tail
    assert " passed" in out.stdout and " failed" not in out.stdout, tail


IMPORT_ALL = r"""
import os, pkgutil, importlib, sys
from tests.helpers import platform_sim
kind = sys.argv[1]
platform_sim.apply(kind)
import platformdirs  # noqa: F401  picks its Linux backend (which needs getuid) here; Windows has its own
for name in platform_sim.IMPORT_ONLY[kind]:
    delattr(os, name)
for name in platform_sim.MISSING[kind] + platform_sim.IMPORT_ONLY[kind]:
    assert not hasattr(os, name), name
if kind == "windows":
    try:
        import fcntl
        raise SystemExit("fcntl importable")
    except ImportError:
        pass
import engine, app, main
count = 0
for pkg in (engine, app):
    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        importlib.import_module(info.name)
        count += 1
from engine.platform import files as platform_io
print(count, platform_io.SYSTEM)
"""


@pytest.mark.parametrize("kind", KINDS)
def test_every_module_imports_without_the_posix_only_functions(kind):
    env = _env(None)
    if kind == "windows":  # Windows always names its user here; getpass (torch asks it) has no getuid there
        env.setdefault("USERNAME", "parley")
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, kind], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    count, system = out.stdout.split()
    assert int(count) > 40 and system == platform_sim.SYS_PLATFORM[kind]
