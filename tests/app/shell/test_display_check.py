"""A bare Linux desktop: no display, or Qt's X11 plugin missing system libraries, gets one message
that says what to install (per distribution) or which commands work without a display."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.shell import display_check

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the X11 check is for Linux")


def _run_main(env_changes: dict, tmp_path) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM", "QT_QPA_PLATFORM_PLUGIN_PATH", "QT_PLUGIN_PATH")
    }
    env.update(env_changes)
    return subprocess.run(
        [sys.executable, str(REPO / "main.py"), "--data-dir", str(tmp_path / "data")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_no_display_says_so_and_points_to_the_headless_commands(tmp_path):
    out = _run_main({}, tmp_path)
    assert out.returncode == 2
    assert "there is no display here" in out.stderr and "python main.py ask" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "data").exists()  # nothing was started


@pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("ldd") is None, reason="needs gcc and ldd")
def test_a_missing_x11_library_is_named_before_qt_starts(tmp_path):
    """A real plugin file whose loader entry names a library this system does not have."""
    build = tmp_path / "build"
    plugins = tmp_path / "plugins"
    build.mkdir()
    plugins.mkdir()
    (build / "dep.c").write_text("int parley_dep(void) { return 1; }\n")
    (build / "plugin.c").write_text("int parley_dep(void);\nint parley_plugin(void) { return parley_dep(); }\n")
    soname = "libxcb-parley-absent.so.9"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(build / soname), f"-Wl,-soname,{soname}", str(build / "dep.c")],
        check=True,
    )
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-o",
            str(plugins / "libqxcb.so"),
            str(build / "plugin.c"),
            f"-L{build}",
            f"-l:{soname}",
        ],
        check=True,
    )
    shutil.rmtree(build)  # the library the plugin needs is gone, as on a bare desktop
    out = _run_main({"DISPLAY": ":7", "QT_QPA_PLATFORM_PLUGIN_PATH": str(plugins)}, tmp_path)
    assert out.returncode == 2
    assert "Qt's X11 platform plugin (xcb) needs system libraries that are not installed" in out.stderr
    assert soname in out.stderr and "apt-file search" in out.stderr
    assert "python main.py ask" in out.stderr
    assert "Traceback" not in out.stderr and "Aborted" not in out.stderr


def test_the_message_names_packages_for_each_distribution():
    msg = display_check.install_message(
        ["libxcb-cursor.so.0", "libxcb-icccm.so.4", "libxcb-keysyms.so.1", "libxkbcommon-x11.so.0"],
        "Qt's X11 platform plugin (xcb)",
    )
    lines = msg.splitlines()
    assert "  Debian/Ubuntu:  sudo apt install libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxkbcommon-x11-0" in lines
    assert "  Fedora:         sudo dnf install xcb-util-cursor xcb-util-wm xcb-util-keysyms libxkbcommon-x11" in lines
    assert "  Arch:           sudo pacman -S xcb-util-cursor xcb-util-wm xcb-util-keysyms libxkbcommon-x11" in lines
    assert "apt-file" not in msg  # every library was known


def test_other_sessions_and_platforms_are_left_to_qt():
    assert display_check.problem({"WAYLAND_DISPLAY": "wayland-0"}) is None
    assert display_check.problem({"QT_QPA_PLATFORM": "offscreen"}) is None
    assert display_check.problem({}, platform="darwin") is None
    assert display_check.problem({}, platform="win32") is None


def test_a_qt_plugin_failure_after_the_check_still_gets_the_hint(tmp_path):
    out = _run_main({"QT_QPA_PLATFORM": "parley-none"}, tmp_path)
    assert out.returncode != 0
    assert 'Could not find the Qt platform plugin "parley-none"' in out.stderr  # Qt's own words
    assert "Parley: Qt could not start its display plugin" in out.stderr
    assert "sudo apt install libxcb-cursor0" in out.stderr and "python main.py ask" in out.stderr
