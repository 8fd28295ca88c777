"""Before Qt starts on Linux: is there a display, and can Qt's X11 plugin load its libraries?

Without this, a bare desktop (a fresh Debian without libxcb-cursor0 and friends) gets only Qt's
"could not load the Qt platform plugin "xcb"" and an abort. Here the missing libraries are
found with the system's loader (`ldd`) before a QApplication exists, and one message names the
packages to install on Debian/Ubuntu, Fedora and Arch. Standard library only: it must run when
Qt itself cannot load.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HEADLESS = (
    'Without a display, the headless commands still work: python main.py ask "..." '
    "[--image PICTURE], python main.py replay SCRIPT.json, python main.py serve."
)

# shared library -> (Debian/Ubuntu, Fedora, Arch) package
PACKAGES: dict[str, tuple[str, str, str]] = {
    "libxcb-cursor.so.0": ("libxcb-cursor0", "xcb-util-cursor", "xcb-util-cursor"),
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm", "xcb-util-wm"),
    "libxcb-util.so.1": ("libxcb-util1", "xcb-util", "xcb-util"),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image", "xcb-util-image"),
    "libxcb-keysyms.so.1": ("libxcb-keysyms1", "xcb-util-keysyms", "xcb-util-keysyms"),
    "libxcb-render-util.so.0": ("libxcb-render-util0", "xcb-util-renderutil", "xcb-util-renderutil"),
    "libxcb-randr.so.0": ("libxcb-randr0", "libxcb", "libxcb"),
    "libxcb-shm.so.0": ("libxcb-shm0", "libxcb", "libxcb"),
    "libxcb-sync.so.1": ("libxcb-sync1", "libxcb", "libxcb"),
    "libxcb-xfixes.so.0": ("libxcb-xfixes0", "libxcb", "libxcb"),
    "libxcb-render.so.0": ("libxcb-render0", "libxcb", "libxcb"),
    "libxcb-shape.so.0": ("libxcb-shape0", "libxcb", "libxcb"),
    "libxcb-xkb.so.1": ("libxcb-xkb1", "libxcb", "libxcb"),
    "libxcb.so.1": ("libxcb1", "libxcb", "libxcb"),
    "libX11-xcb.so.1": ("libx11-xcb1", "libX11-xcb", "libx11"),
    "libX11.so.6": ("libx11-6", "libX11", "libx11"),
    "libxkbcommon.so.0": ("libxkbcommon0", "libxkbcommon", "libxkbcommon"),
    "libxkbcommon-x11.so.0": ("libxkbcommon-x11-0", "libxkbcommon-x11", "libxkbcommon-x11"),
    "libGL.so.1": ("libgl1", "libglvnd-glx", "libglvnd"),
    "libEGL.so.1": ("libegl1", "libglvnd-egl", "libglvnd"),
    "libOpenGL.so.0": ("libopengl0", "libglvnd-opengl", "libglvnd"),
    "libfontconfig.so.1": ("libfontconfig1", "fontconfig", "fontconfig"),
    "libfreetype.so.6": ("libfreetype6", "freetype", "freetype2"),
    "libdbus-1.so.3": ("libdbus-1-3", "dbus-libs", "dbus"),
    "libglib-2.0.so.0": ("libglib2.0-0", "glib2", "glib2"),
    "libgthread-2.0.so.0": ("libglib2.0-0", "glib2", "glib2"),
    "libSM.so.6": ("libsm6", "libSM", "libsm"),
    "libICE.so.6": ("libice6", "libICE", "libice"),
}
_NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found", re.MULTILINE)
_DLOPEN_ERR = re.compile(r"([\w.+-]+\.so[\w.]*): cannot open shared object file")


def _pyside_dir() -> Path | None:
    spec = importlib.util.find_spec("PySide6")  # locates the package without loading Qt
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def xcb_plugin(environ=os.environ) -> tuple[Path | None, list[Path]]:
    """(the libqxcb.so Qt would load, the folders searched), in Qt's order."""
    dirs = []
    if environ.get("QT_QPA_PLATFORM_PLUGIN_PATH"):
        dirs.append(Path(environ["QT_QPA_PLATFORM_PLUGIN_PATH"]))
    dirs += [Path(p) / "platforms" for p in environ.get("QT_PLUGIN_PATH", "").split(os.pathsep) if p]
    pyside = _pyside_dir()
    if pyside is not None:
        dirs.append(pyside / "Qt" / "plugins" / "platforms")
    for d in dirs:
        if (d / "libqxcb.so").is_file():
            return d / "libqxcb.so", dirs
    return None, dirs


def missing_libraries(path: Path) -> list[str]:
    """Shared libraries `path` needs that the system's loader cannot find (in order, once each)."""
    ldd = shutil.which("ldd")
    if ldd:
        try:
            out = subprocess.run([ldd, str(path)], capture_output=True, text=True, timeout=20)
            return list(dict.fromkeys(_NOT_FOUND.findall(out.stdout + out.stderr)))
        except (OSError, subprocess.SubprocessError):
            pass
    import ctypes  # no ldd (e.g. a musl system): the loader names the first missing library

    try:
        ctypes.CDLL(str(path))
        return []
    except OSError as exc:
        m = _DLOPEN_ERR.search(str(exc))
        return [m.group(1)] if m else [str(exc)]


def install_message(missing: list[str], what: str) -> str:
    known = [lib for lib in missing if lib in PACKAGES]
    lines = [
        f"Parley's window cannot start: {what} needs system libraries that are not installed: {', '.join(missing)}."
    ]
    if known:

        def pkgs(i: int) -> str:
            return " ".join(dict.fromkeys(PACKAGES[lib][i] for lib in known))

        lines += [
            "Install them, then start Parley again:",
            f"  Debian/Ubuntu:  sudo apt install {pkgs(0)}",
            f"  Fedora:         sudo dnf install {pkgs(1)}",
            f"  Arch:           sudo pacman -S {pkgs(2)}",
        ]
    unknown = [lib for lib in missing if lib not in PACKAGES]
    if unknown:
        lines.append(
            f"Find the package that provides {', '.join(unknown)} in your distribution "
            "(e.g. apt-file search, dnf provides, pacman -F)."
        )
    lines.append(HEADLESS)
    return "\n".join(lines)


def problem(environ=os.environ, platform: str = sys.platform) -> str | None:
    """Why the window cannot start here, as a message for the user; None when it can (or when
    it is not ours to tell: another OS, or a Qt platform other than X11 chosen explicitly)."""
    if not (platform.startswith("linux") or "bsd" in platform):
        return None
    pyside = _pyside_dir()
    if pyside is not None:  # QtGui / QtWidgets' own libraries (EGL, fontconfig, xkbcommon...)
        widgets = next(iter(sorted(pyside.glob("QtWidgets.*.so"))), None)
        if widgets is not None and (missing := missing_libraries(widgets)):
            return install_message(missing, "Qt")
    chosen = re.split(r"[;:]", environ.get("QT_QPA_PLATFORM", ""))[0].strip()
    if chosen and chosen != "xcb":
        return None  # offscreen, wayland, vnc...: asked for explicitly; Qt reports its own errors
    if not chosen and not environ.get("DISPLAY"):
        if environ.get("WAYLAND_DISPLAY"):
            return None  # a Wayland session: Qt uses its wayland plugin
        return (
            "Parley's window needs a desktop session, and there is no display here ($DISPLAY and "
            "$WAYLAND_DISPLAY are not set).\n" + HEADLESS
        )
    plugin, _searched = xcb_plugin(environ)
    if plugin is None:  # laid out otherwise (a bundle): Qt looks for itself; its failure gets the hint
        return None
    missing = missing_libraries(plugin)
    return install_message(missing, "Qt's X11 platform plugin (xcb)") if missing else None


def qt_failed_hint() -> str:
    """Said after Qt's own fatal message when a platform plugin fails anyway."""
    return (
        "Parley: Qt could not start its display plugin (above). On Linux, check that a desktop "
        "session is running and the X11 libraries are installed (Debian/Ubuntu: sudo apt install "
        "libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxcb-image0 libxcb-render-util0 "
        "libxkbcommon-x11-0; Fedora: sudo dnf install xcb-util-cursor xcb-util-wm xcb-util-keysyms "
        "xcb-util-image xcb-util-renderutil libxkbcommon-x11; Arch: sudo pacman -S xcb-util-cursor "
        "xcb-util-wm xcb-util-keysyms xcb-util-image xcb-util-renderutil libxkbcommon-x11).\n" + HEADLESS
    )
