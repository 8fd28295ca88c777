"""A session's state has one owner, engine/local/session.py: everyone else reads it and changes
it only through Session's methods, which keep the cache holding exactly the session's tokens."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SESSION_PY = ROOT / "engine" / "local" / "session.py"


def _session_fields() -> set[str]:
    """The attributes Session's __init__ assigns (its private state)."""
    tree = ast.parse(SESSION_PY.read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Session")
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    return {
        t.attr for n in ast.walk(init) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Attribute)
    }


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


# ------------------------------------------------------------ the invariant, with a real cache


def _prompt(ids: list[int], pictures: dict[int, tuple[int, bytes]]):
    """A prompt of text and picture chunks: pictures maps a start to (length, key)."""
    from engine.local.prompt import PictureChunk, Prompt, TextChunk
    from engine.pictures.span import PictureKey, PictureSpan
    from engine.vision.entry import PictureEntry

    chunks, done = [], 0
    for start, (length, key) in sorted(pictures.items()):
        if start > done:
            chunks.append(TextChunk(done, tuple(ids[done:start])))
        entry = PictureEntry(PictureKey(key), "", length)
        chunks.append(
            PictureChunk(
                PictureSpan(start, start + length, PictureKey(key)),
                entry,
                tuple(ids[start : start + length]),
                ids[start],
            )
        )
        done = start + length
    if done < len(ids):
        chunks.append(TextChunk(done, tuple(ids[done:])))
    return Prompt(tuple(chunks))


def _feed(cache, n: int) -> None:
    """The model ran `n` more tokens into the cache (one layer, real tensors)."""
    import torch

    cache.update(torch.zeros(1, 2, n, 4), torch.zeros(1, 2, n, 4), 0)


def _holds(session) -> int:
    assert session.cache.get_seq_length() == len(session.ids) == session.cached_tokens
    return session.cached_tokens


def test_the_cache_holds_exactly_the_sessions_tokens_through_every_change():
    from transformers import DynamicCache

    from engine.local.session import Session

    ids = list(range(100, 120)) + [7] * 10 + list(range(200, 210))  # a 10-token picture at 20
    prompt = _prompt(ids, {20: (10, b"A")})
    s = Session("c")
    assert s.reusable_prefix(prompt) == 0
    s.reset_to(prompt, 0, DynamicCache())
    _feed(s.cache, 25)
    s.grow_to(prompt, 25)  # a prefix may end inside a picture (a restore of whole blocks does)
    assert _holds(s) == 25 and [(p.start, p.end) for p in s.pictures] == [(20, 30)]  # its whole span
    _feed(s.cache, 15)
    s.grow_to(prompt, 40)
    assert _holds(s) == 40 and [p.key for p in s.pictures] == [b"A"]
    _feed(s.cache, 1 + 3)  # a decode step with a 3-token draft, 1 of them accepted
    s.append([300, 301])
    assert _holds(s) == 42 and s.ids[-2:] == (300, 301)
    s.crop(41)  # stopped: the accepted draft token was never sent
    assert _holds(s) == 41

    # the same ids with another picture at the same place: reuse stops where the pictures differ
    assert s.reusable_prefix(_prompt(ids + [300, 5], {20: (10, b"B")})) == 20
    assert s.reusable_prefix(_prompt(ids + [300, 5], {20: (10, b"A")})) == 41
    # a prompt that diverges inside the same picture is reused into it: KV is causal, so the
    # picture's first tokens hold the same KV whatever follows them
    assert s.reusable_prefix(_prompt(ids[:25] + [9] * 20, {20: (10, b"A")})) == 25
    # the last token is always run again
    again = _prompt(ids + [300], {20: (10, b"A")})
    assert s.reusable_prefix(again) == 40
    s.reset_to(again, 40)
    assert _holds(s) == 40
    s.drop_kv()
    assert s.cache is None and s.ids == () and s.pictures == ()
    with pytest.raises(ValueError):
        s.reset_to(again, 10)  # nothing held: only a given cache can be reset to


def test_no_boundary_falls_inside_a_picture():
    from engine.local.runner import prefill_chunks
    from engine.pictures.span import PictureKey, PictureSpan, cut_after, cut_before, pictures_agree

    a, b = PictureSpan(10, 20, PictureKey(b"a")), PictureSpan(20, 30, PictureKey(b"b"))
    assert [cut_before(n, (a, b)) for n in (5, 10, 15, 20, 25, 30)] == [5, 10, 10, 20, 20, 30]
    assert [cut_after(n, (a, b)) for n in (5, 10, 15, 20, 25)] == [5, 10, 20, 20, 30]
    pieces = prefill_chunks(0, 40, (a, b), 4)
    assert pieces == [(0, 4), (4, 8), (8, 10), (10, 20), (20, 30), (30, 34), (34, 38), (38, 40)]
    other = PictureSpan(20, 30, PictureKey(b"c"))
    assert pictures_agree(0, 40, (a, b), (a, other)) == 20
    assert pictures_agree(25, 40, (a, b), (a, other)) == 25  # it differs before the range: nothing shared
    assert pictures_agree(0, 40, (a, b), (a, b)) == 40
