"""The house rules of the imports, so a newcomer can trust the folder names (docs/design.md):

- the torch-free rooms import neither torch nor Qt (a fresh interpreter imports every module);
- nothing under engine/ imports Qt, and every engine module lives in a room;
- app/ imports only the engine rooms meant for it, and never torch;
- engine's rooms import only the rooms below them (the table below);
- app/'s rooms likewise (APP_HOUSE), each through its front door: another room imports the room's
  package (what its __init__ exports), never a module inside it; history never imports Qt;
- tests live in rooms beside the code (tests/engine/<room>, tests/app/<room>, ...), and no module
  imports a test module: what tests share lives in tests/helpers/ (fixtures in a conftest.py).
The static checks read every import statement with ast, also those inside functions and under
TYPE_CHECKING: an import made late or only for annotations is still an arrow in the house.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# importable without torch or Qt (engine.headless: at import time; a command imports torch when it starts
# the built-in engine)
TORCH_FREE = [
    "engine.platform",
    "engine.pictures",
    "engine.protocol",
    "engine.remote",
    "engine.library",
    "engine.headless",
]
# single torch-free modules of rooms that are not: the model family table, the folder check the window
# runs before torch is in, and the import lock itself
TORCH_FREE_MODULES = ["engine.model.families", "engine.model.folder_check", "engine.model.heavy_imports"]
HEAVY = ["torch", "PySide6"]
QT = ("PySide6", "PySide2", "PyQt5", "PyQt6", "shiboken6", "shiboken2", "qtpy")

# which rooms each engine room may import (besides itself): lower rooms only, so no arrow runs back up
BELOW_VISION = {"model", "device", "protocol", "pictures", "platform"}
ROOMS = {
    "platform": set(),
    "pictures": {"platform"},
    "protocol": {"pictures", "platform"},
    "device": {"protocol", "pictures", "platform"},
    "model": {"device", "protocol", "pictures", "platform"},
    "vision": BELOW_VISION,
    "kvstore": BELOW_VISION,
    "local": BELOW_VISION | {"vision", "kvstore"},
    "api": BELOW_VISION | {"vision", "kvstore", "local"},
    "remote": {"protocol", "pictures", "platform"},  # the engine protocol over HTTP: no model, no torch
    "library": {"model", "platform"},  # model only through its torch-free modules (family table, import lock, speed)
    "headless": BELOW_VISION | {"vision", "kvstore", "local", "api", "remote", "library"},
}
# (importer, imported): why this arrow may run against the table, until it is gone
ROOM_EXCEPTIONS: dict[tuple[str, str], str] = {}

# what app/ may import from engine/: whole rooms, and single modules of the others
APP_ENGINE_ROOMS = {
    "engine.protocol": "turns in, events out: the window speaks only the protocol",
    "engine.pictures": "pictures the user adds are refs in the shared picture store",
    "engine.platform": "paths and durable files (history's SQLite, settings)",
    "engine.library": "the Models page: catalog, fit, downloads, installed models",
    "engine.remote": "the window can talk to a server instead of the built-in engine",
    "engine.api": "the window can serve its engine over HTTP",
}
APP_ENGINE_MODULES = {
    "engine.local.engine": "the Engine class the bridge starts; nothing else of local/",
    "engine.model.folder_check": "the window's model-folder check, torch-free",
    "engine.model.speed": "the Models page's expected tokens/s: this machine's measured format speeds (torch-free)",
}


# which rooms each app room may import (besides itself and the root modules): lower rooms only, so no
# arrow runs back up
APP_HOUSE = {
    "history": set(),  # conversations on disk, no Qt
    "settings": set(),
    "memory": set(),
    "models": set(),
    "composer": {"history"},  # pictures taken in are stored in the history
    "connection": {"settings", "memory"},  # the API server's settings; the dock a remote engine shows
    "chat": {"connection", "composer", "memory", "settings", "history"},
    "shell": {"chat", "composer", "connection", "memory", "settings", "models", "history"},
}
# modules at app/'s root, which every room may import and which import no room; app/__init__ (the
# package's door) also imports shell, on first use, for run_app
APP_ROOT_MODULES = {"icons", "theme", "sizes", "version", "pyside_refcount_fix", "worker"}
APP_QT_FREE = ["history"]


def _module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def imports_of(path: Path) -> list[tuple[str, int]]:
    """(absolute module, line) for every import in one file: relative ones resolved, and for
    `from PKG import NAME` the submodule PKG.NAME where NAME is one."""
    name, is_package = _module_name(path)
    package = name if is_package else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            found.append((module, node.lineno))
            for alias in node.names:
                sub = ROOT.joinpath(*module.split("."), alias.name)
                if sub.with_suffix(".py").is_file() or (sub / "__init__.py").is_file():
                    found.append((f"{module}.{alias.name}", node.lineno))
    return found


def _sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _room(module: str, house: str = "engine") -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == house and len(parts) > 1 else None


def _app_room(module: str) -> str | None:
    """The room of an app module; None for the package itself and its root modules."""
    room = _room(module, "app")
    return None if room in APP_ROOT_MODULES else room


# a fresh interpreter imports each module of the package in turn and names the first that brought in
# torch or Qt
_IMPORT_ALL = """
import importlib, json, pkgutil, sys
package = importlib.import_module(sys.argv[1])
names = [package.__name__] + [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
for name in names:
    importlib.import_module(name)
    heavy = [h for h in sys.argv[2:] if h in sys.modules]
    if heavy:
        print(json.dumps({"module": name, "imported": heavy}))
        break
"""


@pytest.mark.parametrize("package", TORCH_FREE)
def test_torch_free_rooms_import_neither_torch_nor_qt(package):
    out = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL, package, *HEAVY], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "", f"{package} is torch-free, but importing {json.loads(out.stdout)}"


@pytest.mark.parametrize("module", TORCH_FREE_MODULES)
def test_torch_free_modules_import_neither_torch_nor_qt(module):
    code = (
        f"import importlib, sys; importlib.import_module({module!r}); print(sorted(set({HEAVY!r}) & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"{module} is torch-free, but importing it imported {out.stdout.strip()}"


def test_engine_never_imports_qt():
    bad = [
        f"{p.relative_to(ROOT)}:{line} imports {m}"
        for p in _sources("engine")
        for m, line in imports_of(p)
        if m.split(".")[0] in QT
    ]
    assert not bad, "\n".join(bad)


def test_every_engine_module_lives_in_a_room():
    loose = [p.name for p in (ROOT / "engine").glob("*.py") if p.name != "__init__.py"]
    rooms = sorted(p.name for p in (ROOT / "engine").iterdir() if (p / "__init__.py").is_file())
    assert loose == [], "engine/ holds only rooms: move these into one"
    assert rooms == sorted(ROOMS), "a new room needs its line in ROOMS (which rooms it may import)"


def test_engine_rooms_import_only_rooms_below_them():
    bad = []
    for path in _sources("engine"):
        importer = _module_name(path)[0]
        here = _room(importer)
        for module, line in imports_of(path):
            there = _room(module)
            if there is None or there == here or (importer, module) in ROOM_EXCEPTIONS:
                continue
            if here is None or there not in ROOMS[here]:
                bad.append(f"{path.relative_to(ROOT)}:{line} ({here}) imports {module} ({there})")
    assert not bad, "\n".join(bad)


def test_room_exceptions_are_still_needed():
    """An exception whose import is gone is removed with it, so the list only shrinks."""
    present = {(_module_name(p)[0], m) for p in _sources("engine") for m, _ in imports_of(p)}
    assert set(ROOM_EXCEPTIONS) <= present


def test_app_imports_only_the_engine_rooms_meant_for_it():
    bad = []
    for path in _sources("app"):
        for module, line in imports_of(path):
            top = module.split(".")[0]
            if top in ("torch", "transformers"):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}: the window never calls torch")
            if top != "engine" or module in APP_ENGINE_MODULES:
                continue
            room = ".".join(module.split(".")[:2])
            if room not in APP_ENGINE_ROOMS:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not bad, "\n".join(bad)


def test_every_app_module_lives_in_a_room():
    loose = sorted(p.stem for p in (ROOT / "app").glob("*.py") if p.name != "__init__.py")
    rooms = sorted(p.name for p in (ROOT / "app").iterdir() if (p / "__init__.py").is_file())
    assert loose == sorted(APP_ROOT_MODULES), "app/ holds rooms and its few root modules: move the others into one"
    assert rooms == sorted(APP_HOUSE), "a new room needs its line in APP_HOUSE (which rooms it may import)"


def test_app_rooms_import_only_rooms_below_them():
    bad = []
    for path in _sources("app"):
        importer = _module_name(path)[0]
        here = _app_room(importer)
        for module, line in imports_of(path):
            if module.split(".")[0] != "app":
                continue
            there = _app_room(module)
            if there is None or there == here or (importer == "app" and there == "shell"):
                continue
            if here is None or there not in APP_HOUSE[here]:
                bad.append(f"{path.relative_to(ROOT)}:{line} ({here or 'root'}) imports {module} ({there})")
    assert not bad, "\n".join(bad)


def test_app_rooms_are_entered_through_their_front_door():
    """Another room imports a room's package, so its __init__ says all that the others use."""
    bad = []
    for path in _sources("app"):
        here = _app_room(_module_name(path)[0])
        found = imports_of(path)
        for module, line in found:
            there = _app_room(module)
            # `from app.memory import turn_line` names the function the package exports, not its module
            through_door = module == f"app.{there}" or (f"app.{there}", line) in found
            if there is not None and there != here and here is not None and not through_door:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}: import it from app.{there}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("room", APP_QT_FREE)
def test_app_qt_free_rooms_never_import_qt(room):
    bad = [
        f"{p.relative_to(ROOT)}:{line} imports {m}"
        for p in _sources(f"app/{room}")
        for m, line in imports_of(p)
        if m.split(".")[0] in QT
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("table", [ROOMS, APP_HOUSE], ids=["engine", "app"])
def test_room_tables_run_one_way(table):
    """Each table is a ladder: no room may import, even through others, a room that may import it."""

    def reach(room: str, seen: frozenset[str] = frozenset()) -> set[str]:
        assert room not in seen, f"rooms import each other round a circle: {' -> '.join([*seen, room])}"
        return set().union(table[room], *(reach(r, seen | {room}) for r in table[room]))

    for room in table:
        assert room not in reach(room)


def test_tests_live_in_rooms_and_import_no_test_module():
    loose = [p.name for p in (ROOT / "tests").glob("test_*.py")]
    assert loose == [], "tests/ holds rooms (engine/<room>, app/<room>, packaging, rules, helpers): move these into one"
    bad = [
        f"{p.relative_to(ROOT)}:{line} imports {m}"
        for folder in ("tests", "packaging", "engine", "app")
        for p in _sources(folder)
        for m, line in imports_of(p)
        if m.rpartition(".")[2].startswith("test_")
    ]
    assert not bad, "move what they share to tests/helpers/:\n" + "\n".join(bad)


def _circles(folder: str, scripts: bool = False) -> list[list[str]]:
    """Groups of modules under `folder` that import each other round a circle (Tarjan's strongly
    connected components). `scripts`: the folder's files import each other by bare name."""
    paths = {_module_name(p)[0]: p for p in _sources(folder)}
    bare = {name.rpartition(".")[2]: name for name in paths} if scripts else {}
    graph = {
        name: {m for m in (bare.get(m, m) for m, _ in imports_of(path)) if m in paths and m != name}
        for name, path in paths.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(group) > 1:
                circles.append(sorted(group))

    for name in graph:
        if name not in index:
            visit(name)
    return circles


@pytest.mark.parametrize("folder, scripts", [("engine", False), ("app", False), ("packaging/demo_model", True)])
def test_no_two_modules_import_each_other(folder, scripts):
    """A circle (kvstore.index and spill_job once, through TYPE_CHECKING) means neither module can be
    read alone; the records both need go to a leaf module."""
    assert _circles(folder, scripts) == []
