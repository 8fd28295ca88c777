"""A session's state has one owner, engine/local/session.py: everyone else reads it and changes
it only through Session's methods, which keep the cache holding exactly the session's tokens."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SESSION_PY = ROOT / "engine" / "local" / "session.py"


def _session_fields() -> set[str]:
    """The attributes Session's __init__ assigns (its private state)."""
    tree = ast.parse(SESSION_PY.read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Session")
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    return {t.attr for n in ast.walk(init) if isinstance(n, ast.Assign) for t in n.targets
            if isinstance(t, ast.Attribute)}


def _assigned_attributes(tree: ast.AST):
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Attribute):
                    yield sub, node.lineno


def test_session_fields_are_private():
    fields = _session_fields()
    assert fields and all(f.startswith("_") for f in fields), fields


def test_no_module_but_session_py_assigns_a_session_field():
    """`x._tags = ...` (or any of Session's fields, on anything but `self`) outside session.py."""
    fields = _session_fields()
    bad = []
    for path in sorted((ROOT / "engine").rglob("*.py")) + sorted((ROOT / "tests").rglob("*.py")):
        if path == SESSION_PY:
            continue
        for attr, line in _assigned_attributes(ast.parse(path.read_text(encoding="utf-8"))):
            owner = attr.value
            if attr.attr in fields and not (isinstance(owner, ast.Name) and owner.id == "self"):
                bad.append(f"{path.relative_to(ROOT)}:{line} assigns .{attr.attr}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", ["conversation_id", "cache", "rope_delta", "last_used", "version"])
def test_session_state_is_read_only_outside_its_methods(name):
    from engine.local.session import Session

    s = Session("c")
    with pytest.raises(AttributeError):
        setattr(s, name, None)
