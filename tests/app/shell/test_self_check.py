"""`parley --self-check` (app/shell/self_check.py), from the checkout: what `make bundle-check` runs in the
bundle. It passes here with one line per check, and a module that cannot be imported is named."""

from __future__ import annotations

import io
import sys

import pytest

from app.shell import self_check

CHECKS = ["imports", "model", "picture", "pdf page", "video frame", "window"]


def test_every_check_passes_from_the_checkout(qapp):
    out = io.StringIO()
    assert self_check.run(out) == 0, out.getvalue()
    lines = out.getvalue().splitlines()
    assert [line[6:18].strip() for line in lines[:-1] if line.startswith("ok  ")] == CHECKS, lines
    assert lines[-1] == f"self-check passed: {len(CHECKS)} checks"
    replies = [line for line in lines if line[6:18].strip() in ("picture", "pdf page", "video frame")]
    assert all("red" in line for line in replies), replies  # each picture reached the model


def test_a_missing_module_is_named(tmp_path, monkeypatch):
    """A bundle that lacks a dependency fails the import check with the module's name, not a
    generic error: the line a person reads first."""
    pkg = tmp_path / "parley_probe"
    (pkg / "inner").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "fine.py").write_text("import json\n")
    (pkg / "inner" / "__init__.py").write_text("")
    (pkg / "inner" / "video.py").write_text("import parley_absent_codec\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(self_check, "PACKAGES", ("parley_probe",))
    with pytest.raises(self_check.CheckFailed) as failed:
        self_check.check_imports()
    assert str(failed.value).startswith("parley_probe.inner.video: missing module 'parley_absent_codec'")
    for name in [m for m in sys.modules if m.startswith("parley_probe")]:
        monkeypatch.delitem(sys.modules, name)


def test_the_command_line_has_the_flag():
    from main import build_parser

    assert build_parser().parse_args(["--self-check"]).self_check
