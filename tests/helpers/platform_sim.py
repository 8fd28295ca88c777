"""Run Parley as Windows or macOS would, on this Linux machine (PARLEY_SIMULATE_PLATFORM).

What the simulation does, before any engine module is imported:
- removes what the target OS's Python lacks: Windows has no os.pread / pwrite / preadv /
  pwritev / readv / writev / fdatasync / O_DIRECTORY / O_CLOEXEC / getuid and no `fcntl`
  module (getuid / geteuid too, in the import test: pytest needs them); macOS has no os.fdatasync
  (and, on older builds, no preadv / pwritev);
- on macOS, `fcntl` is the real module plus F_FULLFSYNC, which this kernel lacks: the call is
  answered with fsync and counted (`full_fsync_calls`), so tests see the macOS path taken;
- engine.platform.files is imported with sys.platform set to the target, so it picks that OS's
  durability rules (no directory fsync on Windows, F_FULLFSYNC on macOS); the rest of the
  process keeps the real sys.platform (torch, Qt and the stdlib would break otherwise).

What it cannot do: run Windows' LockFileEx or MoveFileExW. `filelock` is imported before
fcntl disappears, so the store lock stays the kernel's flock, which behaves like LockFileEx
for Parley (exclusive, refused at once, released when the process dies); MoveFileExW is
absent here, so publishing falls back to os.replace.

Child Pythons started by tests get the same simulation through tests/helpers/platform_sim_boot
(a sitecustomize on PYTHONPATH), so the SIGKILL crash tests' writers run simulated too.
"""

from __future__ import annotations

import importlib
import os
import sys
import types

ENV = "PARLEY_SIMULATE_PLATFORM"
BOOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "platform_sim_boot")
MISSING = {
    "windows": ("pread", "pwrite", "preadv", "pwritev", "readv", "writev", "fdatasync", "O_DIRECTORY", "O_CLOEXEC"),
    "macos": ("fdatasync", "preadv", "pwritev"),
}
# also absent on Windows, but pytest itself needs them (tmp_path asks getpass for the user):
# removed only by the import test, which runs no pytest machinery
IMPORT_ONLY = {"windows": ("getuid", "geteuid"), "macos": ()}
SYS_PLATFORM = {"windows": "win32", "macos": "darwin"}
F_FULLFSYNC = 51  # macOS's value; Linux has no such command

active: str | None = None
full_fsync_calls = 0


def _macos_fcntl(real: types.ModuleType) -> types.ModuleType:
    mod = types.ModuleType("fcntl")
    mod.__dict__.update({k: v for k, v in vars(real).items() if not k.startswith("__")})
    mod.F_FULLFSYNC = F_FULLFSYNC

    def fcntl(fd, cmd, arg=0):
        global full_fsync_calls
        if cmd == F_FULLFSYNC:
            os.fsync(fd)  # the nearest this kernel has
            full_fsync_calls += 1
            return 0
        return real.fcntl(fd, cmd, arg)

    mod.fcntl = fcntl
    return mod


def apply(kind: str) -> None:
    """Idempotent; must run before engine.platform.files is imported."""
    global active
    if active == kind:
        return
    if kind not in MISSING:
        raise SystemExit(f"{ENV}={kind!r}: use one of {', '.join(MISSING)}")
    if active is not None or "engine.platform.files" in sys.modules:
        raise RuntimeError("the platform simulation must be applied before engine modules are imported")
    import filelock  # noqa: F401  keeps the kernel lock (see the module docstring)

    real_fcntl = importlib.import_module("fcntl")
    for name in MISSING[kind]:
        if hasattr(os, name):
            delattr(os, name)
    sys.modules["fcntl"] = None if kind == "windows" else _macos_fcntl(real_fcntl)  # None: import fails
    real_platform = sys.platform
    sys.platform = SYS_PLATFORM[kind]
    try:
        importlib.import_module("engine.platform.files")
    finally:
        sys.platform = real_platform
    active = kind
    # child Pythons started by tests apply it too
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if BOOT_DIR not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([BOOT_DIR] + paths)


def from_environment() -> str | None:
    kind = os.environ.get(ENV) or None
    if kind:
        apply(kind)
    return kind
