"""Install Parley's desktop entry and icons for the current user (XDG), or remove them.

    .venv/bin/python packaging/linux/install_desktop.py install     # what `make install-desktop` runs
    python3 packaging/linux/install_desktop.py uninstall            # `make uninstall-desktop`
    python3 Parley/install-desktop.py install                       # from an unpacked bundle archive

From a checkout, the entry's Exec runs the project's venv python with main.py, both as absolute
paths filled in here (the python that runs this script, unless --python says otherwise). From a
bundle (this script beside the `parley` executable, as `make bundle-archive` packs it, or
--bundle DIR), Exec runs that executable and the icons come from the bundle's resources. Files go to
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TEMPLATE = HERE / "parley.desktop"
ICONS = ROOT / "resources" / "icons"
BUNDLE_EXECUTABLE = "parley"
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


def render_entry(python: str, main: str | None, template: str | None = None) -> str:
    """The template with TryExec / Exec filled in with these absolute paths (`main` None: `python`
    is the bundle's executable, run alone)."""
    text = TEMPLATE.read_text(encoding="utf-8") if template is None else template
    command = [python] if main is None else [python, main]
    out = []
    for line in text.splitlines():
        if line.startswith("TryExec="):
            line = "TryExec=" + string_escape(python)
        elif line.startswith("Exec="):
            line = "Exec=" + string_escape(" ".join(exec_quote(arg) for arg in command))
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


def bundle_icons(bundle: Path) -> Path | None:
    """resources/icons inside a PyInstaller folder (6.x puts data under _internal/)."""
    for icons in (bundle / "_internal" / "resources" / "icons", bundle / "resources" / "icons"):
        if (icons / "parley.svg").is_file():
            return icons
    return None


def beside_bundle() -> Path | None:
    """The bundle folder this script was unpacked into, if it was (next to the executable)."""
    exe = HERE / BUNDLE_EXECUTABLE
    return HERE if exe.is_file() and os.access(exe, os.X_OK) and bundle_icons(HERE) else None


def install(base: Path, python: str, main: str | None, icons: Path = ICONS) -> list[Path]:
    entry, svg, *pngs = installed_files(base)
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.with_suffix(".desktop.tmp")
    tmp.write_text(render_entry(python, main), encoding="utf-8")
    os.replace(tmp, entry)
    svg.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(icons / "parley.svg", svg)
    for size, dest in zip(PNG_SIZES, pngs, strict=True):
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(icons / "app" / f"parley-{size}.png", dest)
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
    parser.add_argument(
        "--bundle",
        type=Path,
        help="a bundle folder (dist/Parley, or where the archive was unpacked): Exec runs its `parley` "
        "(the default when this script sits in one)",
    )
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
    bundle = args.bundle or beside_bundle()
    if bundle is not None:
        bundle = bundle.resolve()
        exe, icons = bundle / BUNDLE_EXECUTABLE, bundle_icons(bundle)
        if not (exe.is_file() and os.access(exe, os.X_OK)) or icons is None:
            print(f"error: {bundle} is not a Parley bundle (no executable `parley` and icons)", file=sys.stderr)
            return 1
        files = install(base, str(exe), None, icons)
        print(f"installed {files[0]} and {len(files) - 1} icons under {base / 'icons' / 'hicolor'}")
        print(f"  Exec: {exe}")
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
