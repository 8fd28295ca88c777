"""Install Parley's desktop entry and icons for the current user (XDG), or remove them.

    .venv/bin/python packaging/linux/install_desktop.py install     # what `make install-desktop` runs
    python3 packaging/linux/install_desktop.py uninstall            # `make uninstall-desktop`

The entry's Exec runs the project's venv python with main.py, both as absolute paths filled in
here (the python that runs this script, unless --python says otherwise). Files go to
$XDG_DATA_HOME (default ~/.local/share): applications/parley.desktop and
icons/hicolor/<N>x<N>/apps/parley.png, icons/hicolor/scalable/apps/parley.svg.
Standard library only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = Path(__file__).resolve().with_name("parley.desktop")
ICONS = ROOT / "resources" / "icons"
APP_ID = "parley"  # = QGuiApplication.desktopFileName() in app/shell/main.py
PNG_SIZES = (16, 22, 24, 32, 48, 64, 128, 256, 512)

_RESERVED = set(" \t\n\"'\\><~|&;$*?#()`")


def data_home(env: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if env is None else env
    value = environ.get("XDG_DATA_HOME", "")
    if value and os.path.isabs(value):
        return Path(value)
    return Path(environ.get("HOME") or Path.home()) / ".local" / "share"


def exec_quote(arg: str) -> str:
    """One Exec argument, quoted per the Desktop Entry spec ('%' doubled), not yet string-escaped."""
    arg = arg.replace("%", "%%")
    if not arg or any(c in _RESERVED for c in arg):
        arg = '"' + "".join("\\" + c if c in '"`$\\' else c for c in arg) + '"'
    return arg


def string_escape(value: str) -> str:
    """The desktop file's own escaping of a string value (applied after Exec quoting)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")


def render_entry(python: str, main: str, template: str | None = None) -> str:
    """The template with TryExec / Exec filled in with these absolute paths."""
    text = TEMPLATE.read_text(encoding="utf-8") if template is None else template
    out = []
    for line in text.splitlines():
        if line.startswith("TryExec="):
            line = "TryExec=" + string_escape(python)
        elif line.startswith("Exec="):
            line = "Exec=" + string_escape(f"{exec_quote(python)} {exec_quote(main)}")
        out.append(line)
    rendered = "\n".join(out) + "\n"
    if "@PYTHON@" in rendered or "@MAIN@" in rendered:
        raise ValueError("the template has placeholders outside TryExec= / Exec=")
    return rendered


def installed_files(base: Path) -> list[Path]:
    icons = base / "icons" / "hicolor"
    return [base / "applications" / f"{APP_ID}.desktop", icons / "scalable" / "apps" / f"{APP_ID}.svg"] + [
        icons / f"{n}x{n}" / "apps" / f"{APP_ID}.png" for n in PNG_SIZES
    ]


def _refresh_caches(base: Path) -> None:
    """Refresh the caches this user already has (never create new ones; the tools are optional)."""
    apps, hicolor = base / "applications", base / "icons" / "hicolor"
    for cache, cmd in (
        (apps / "mimeinfo.cache", ["update-desktop-database", "-q", str(apps)]),
        (hicolor / "icon-theme.cache", ["gtk-update-icon-cache", "-q", "-t", "-f", str(hicolor)]),
    ):
        if cache.exists() and shutil.which(cmd[0]):
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def install(base: Path, python: str, main: str) -> list[Path]:
    entry, svg, *pngs = installed_files(base)
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.with_suffix(".desktop.tmp")
    tmp.write_text(render_entry(python, main), encoding="utf-8")
    os.replace(tmp, entry)
    svg.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ICONS / "parley.svg", svg)
    for size, dest in zip(PNG_SIZES, pngs, strict=True):
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ICONS / "app" / f"parley-{size}.png", dest)
    _refresh_caches(base)
    return [entry, svg, *pngs]


def uninstall(base: Path) -> list[Path]:
    removed = []
    for path in installed_files(base):
        if path.exists():
            path.unlink()
            removed.append(path)
    _refresh_caches(base)
    return removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("install", "uninstall"))
    parser.add_argument(
        "--python",
        default=os.path.abspath(sys.executable),
        help="interpreter for Exec (default: this one; a venv's python is kept as is, not resolved)",
    )
    parser.add_argument("--data-home", type=Path, help="instead of $XDG_DATA_HOME or ~/.local/share")
    args = parser.parse_args(argv)
    if sys.platform in ("win32", "darwin"):
        print(
            "This installs a freedesktop.org entry (Linux and BSD desktops). On Windows run "
            "packaging/windows/install-shortcut.ps1; on macOS build the app with `make bundle`.",
            file=sys.stderr,
        )
        return 2
    base = args.data_home or data_home()
    if args.action == "uninstall":
        removed = uninstall(base)
        print(f"removed {len(removed)} files" + (f" from {base}" if removed else " (nothing was installed)"))
        return 0
    python = os.path.abspath(args.python)
    if not os.access(python, os.X_OK):
        print(f"error: {python} is not an executable python (run `make setup` first)", file=sys.stderr)
        return 1
    files = install(base, python, str(ROOT / "main.py"))
    print(f"installed {files[0]} and {len(files) - 1} icons under {base / 'icons' / 'hicolor'}")
    print(f"  Exec: {python} {ROOT / 'main.py'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
