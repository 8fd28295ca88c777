"""Double-click launch: the desktop entry, icons, single instance, Windows shortcut script,
PyInstaller spec — and the installed entry's Exec line run as a desktop would run it."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENTRY = ROOT / "packaging" / "linux" / "parley.desktop"
ICONS = ROOT / "resources" / "icons" / "app"
PNG_SIZES = (16, 22, 24, 32, 48, 64, 128, 256, 512)

sys.path.insert(0, str(ROOT / "packaging" / "linux"))
import install_desktop  # noqa: E402

# ------------------------------------------------------------ desktop entry, read as the spec says


def parse_entry(text: str) -> dict[str, str]:
    """A strict reader of the [Desktop Entry] group (what desktop-file-validate would reject fails here)."""
    lines = text.splitlines()
    body = [ln for ln in lines if ln.strip() and not ln.startswith("#")]
    assert body and body[0] == "[Desktop Entry]", "the first group must be [Desktop Entry]"
    keys: dict[str, str] = {}
    for ln in body[1:]:
        if ln.startswith("["):
            break
        assert "=" in ln, f"not a key=value line: {ln!r}"
        key, value = ln.split("=", 1)
        assert key == key.strip() and key.replace("-", "").isalnum(), f"bad key {key!r}"
        assert key not in keys, f"duplicate key {key}"
        keys[key] = value
    return keys


def unescape_string(value: str) -> str:
    out, i = [], 0
    while i < len(value):
        c = value[i]
        if c == "\\" and i + 1 < len(value):
            out.append({"s": " ", "n": "\n", "t": "\t", "r": "\r", "\\": "\\"}[value[i + 1]])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def split_exec(value: str) -> list[str]:
    """The Exec value -> argv, per the Desktop Entry spec (string unescape, then its quoting)."""
    s, args, cur, i, quoted = unescape_string(value), [], [], 0, False
    started = False
    while i < len(s):
        c = s[i]
        if quoted:
            if c == "\\":
                assert s[i + 1] in '"`$\\', f"bad escape in {value!r}"
                cur.append(s[i + 1])
                i += 1
            elif c == '"':
                quoted = False
            else:
                cur.append(c)
        elif c == '"':
            quoted, started = True, True
        elif c == " ":
            if started:
                args.append("".join(cur))
            cur, started = [], False
        else:
            assert c not in install_desktop._RESERVED, f"unquoted reserved {c!r} in {value!r}"
            cur.append(c)
            started = True
        i += 1
    assert not quoted, f"unterminated quote in {value!r}"
    if started:
        args.append("".join(cur))
    assert not any("%" in a.replace("%%", "") for a in args), "field codes are not expected"
    return [a.replace("%%", "%") for a in args]


def test_desktop_entry_is_well_formed_and_matches_the_app():
    keys = parse_entry(ENTRY.read_text(encoding="utf-8"))
    assert keys["Type"] == "Application" and keys["Name"] == "Parley" and keys["Terminal"] == "false"
    assert keys["Icon"] == "parley" == ENTRY.stem
    assert keys["Exec"] == "@PYTHON@ @MAIN@" and keys["TryExec"] == "@PYTHON@"
    for key in ("Categories", "Keywords"):
        assert keys[key].endswith(";"), f"{key} must end with ';'"
    assert keys["Categories"].split(";")[0] in (
        "AudioVideo",
        "Audio",
        "Video",
        "Development",
        "Education",
        "Game",
        "Graphics",
        "Network",
        "Office",
        "Science",
        "Settings",
        "System",
        "Utility",
    )
    src = (ROOT / "app" / "shell" / "main.py").read_text(encoding="utf-8")  # the names the window announces
    assert f'setDesktopFileName("{ENTRY.stem}")' in src
    assert f'setApplicationName("{keys["StartupWMClass"]}")' in src


def test_make_application_sets_names_and_icon(qapp):
    from app.shell.main import make_application

    app = make_application(["/some/where/main.py"])
    assert (app.applicationName(), app.applicationDisplayName(), app.organizationName()) == ("Parley",) * 3
    assert app.desktopFileName() == "parley"
    assert not app.windowIcon().isNull()
    assert {s.width() for s in app.windowIcon().availableSizes()} >= {16, 32, 48, 256}


def test_rendered_exec_survives_awkward_paths():
    python, main = '/opt/my apps/v$env/bin/py"thon', "/home/a\\b/100% `sure`/main.py"
    keys = parse_entry(install_desktop.render_entry(python, main))
    assert split_exec(keys["Exec"]) == [python, main]
    assert unescape_string(keys["TryExec"]) == python
    plain = parse_entry(install_desktop.render_entry("/v/bin/python", "/p/main.py"))
    assert plain["Exec"] == "/v/bin/python /p/main.py"


def test_install_and_uninstall_for_the_user(tmp_path):
    home = tmp_path / "home"
    env = {**os.environ, "HOME": str(home), "XDG_DATA_HOME": ""}

    def run(*a):
        return subprocess.run(
            [sys.executable, str(ROOT / "packaging/linux/install_desktop.py"), *a],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    res = run("install")
    assert res.returncode == 0, res.stderr
    share = home / ".local" / "share"
    entry = share / "applications" / "parley.desktop"
    keys = parse_entry(entry.read_text(encoding="utf-8"))
    assert split_exec(keys["Exec"]) == [os.path.abspath(sys.executable), str(ROOT / "main.py")]
    for n in PNG_SIZES:
        assert png_size(share / f"icons/hicolor/{n}x{n}/apps/parley.png") == (n, n)
    assert (share / "icons/hicolor/scalable/apps/parley.svg").read_bytes().startswith(b"<svg")
    res = run("uninstall")
    assert res.returncode == 0, res.stderr
    assert not [p for p in share.rglob("*") if p.is_file()]


def test_install_from_an_unpacked_bundle_archive(tmp_path):
    """`make bundle-archive` packs this script beside the executable: run from there it points the
    entry at that executable and takes the icons from the bundle, no checkout or venv needed."""
    bundle = tmp_path / "unpacked here" / "Parley"
    (bundle / "_internal" / "resources").mkdir(parents=True)
    shutil.copytree(ROOT / "resources" / "icons", bundle / "_internal" / "resources" / "icons")
    exe = bundle / "parley"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    shutil.copyfile(ROOT / "packaging" / "linux" / "install_desktop.py", bundle / "install-desktop.py")
    shutil.copyfile(ENTRY, bundle / "parley.desktop")
    home = tmp_path / "home"
    res = subprocess.run(
        [sys.executable, str(bundle / "install-desktop.py"), "install"],
        env={**os.environ, "HOME": str(home), "XDG_DATA_HOME": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    share = home / ".local" / "share"
    keys = parse_entry((share / "applications" / "parley.desktop").read_text(encoding="utf-8"))
    assert split_exec(keys["Exec"]) == [str(exe)]
    assert keys["TryExec"] == str(exe)
    for n in PNG_SIZES:
        assert png_size(share / f"icons/hicolor/{n}x{n}/apps/parley.png") == (n, n)


@pytest.mark.skipif(
    shutil.which("desktop-file-validate") is None,
    reason="desktop-file-validate not installed (apt-get install desktop-file-utils)",
)
def test_desktop_file_validate_accepts_template_and_installed_entry(tmp_path):
    entry = tmp_path / "parley.desktop"
    entry.write_text(install_desktop.render_entry("/opt/my apps/bin/python", "/opt/parley/main.py"))
    for path in (ENTRY, entry):
        res = subprocess.run(["desktop-file-validate", str(path)], capture_output=True, text=True, timeout=30)
        assert res.returncode == 0 and not res.stdout.strip(), res.stdout + res.stderr


# ------------------------------------------------------------ icons, Windows, PyInstaller


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">II", head[16:24])


def test_icon_sizes_are_all_there():
    for n in PNG_SIZES:
        assert png_size(ICONS / f"parley-{n}.png") == (n, n)
    ico = (ICONS / "parley.ico").read_bytes()
    reserved, kind, count = struct.unpack("<HHH", ico[:6])
    assert (reserved, kind) == (0, 1)
    sizes = {(ico[6 + 16 * i] or 256) for i in range(count)}
    assert sizes >= {16, 32, 48, 256}
    assert (ICONS / "parley.icns").read_bytes()[:4] == b"icns"


def test_windows_shortcut_script_points_at_the_venv_pythonw():
    ps1 = (ROOT / "packaging" / "windows" / "install-shortcut.ps1").read_text(encoding="utf-8")
    for needle in (
        r".venv\Scripts\pythonw.exe",
        "main.py",
        r"resources\icons\app\parley.ico",
        "'Programs'",
        "'Desktop'",
        "CreateShortcut",
        "[switch]$Uninstall",
    ):
        assert needle in ps1, needle
    pwsh = shutil.which("pwsh") or shutil.which("powershell")
    if pwsh:  # a real parse where PowerShell exists
        script = ROOT / "packaging" / "windows" / "install-shortcut.ps1"
        res = subprocess.run(
            [
                pwsh,
                "-NoProfile",
                "-Command",
                f"$e=$null; [void][System.Management.Automation.Language.Parser]::ParseFile("
                f"'{script}', [ref]$null, [ref]$e); if ($e) {{ $e; exit 1 }}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, res.stdout + res.stderr


def test_pyinstaller_spec_compiles_and_names_what_it_needs():
    spec = (ROOT / "packaging" / "parley.spec").read_text(encoding="utf-8")
    compile(spec, "parley.spec", "exec")
    for needle in ("main.py", "resources", "COLLECT", "BUNDLE", "parley.ico", "parley.icns"):
        assert needle in spec, needle


# ------------------------------------------------------------ single instance, in process


@pytest.fixture
def runtime_dir(monkeypatch):
    short = tempfile.mkdtemp(prefix="prt-")  # socket paths must stay short
    monkeypatch.setenv("XDG_RUNTIME_DIR", short)
    yield Path(short)
    shutil.rmtree(short, ignore_errors=True)


def test_server_name_is_per_data_dir(tmp_path, runtime_dir, monkeypatch):
    from app.shell.single_instance import server_name

    a, b = server_name(tmp_path / "a"), server_name(tmp_path / "b")
    assert a != b and server_name(tmp_path / "x" / ".." / "a") == a
    if sys.platform != "win32":
        assert Path(a).parent == runtime_dir
    (runtime_dir / ("d" * 120)).mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime_dir / ("d" * 120)))  # too long for a socket path
    assert "/" not in server_name(tmp_path / "a")


def test_second_claim_activates_the_first(qtbot, tmp_path, runtime_dir):
    from app.shell.single_instance import SingleInstance

    first, second = SingleInstance.for_data_dir(tmp_path), SingleInstance.for_data_dir(tmp_path)
    assert first.claim()
    with qtbot.waitSignal(first.activated, timeout=10000) as got:
        assert not second.claim({"cmd": "activate", "env": {"XDG_ACTIVATION_TOKEN": "tok-1"}})
    assert got.args[0] == {"cmd": "activate", "env": {"XDG_ACTIVATION_TOKEN": "tok-1"}}
    first.close()
    assert SingleInstance.for_data_dir(tmp_path).claim()  # closed: the next one is first again


@pytest.mark.skipif(sys.platform == "win32", reason="named pipes leave nothing behind")
def test_stale_socket_from_a_crash_does_not_block(qtbot, tmp_path, runtime_dir):
    from app.shell.single_instance import SingleInstance, server_name

    path = server_name(tmp_path)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(path)  # bound, never listening, closed without unlinking: what a crash leaves
    dead.close()
    assert os.path.exists(path)
    first = SingleInstance.for_data_dir(tmp_path)
    assert first.claim()
    with qtbot.waitSignal(first.activated, timeout=10000):
        assert not SingleInstance.for_data_dir(tmp_path).claim()
    first.close()
    assert not os.path.exists(path)


def test_bring_to_front_unminimises_and_passes_the_token(qtbot, monkeypatch):
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QWidget

    from app.shell.single_instance import bring_to_front

    monkeypatch.delenv("XDG_ACTIVATION_TOKEN", raising=False)
    w = QWidget()
    qtbot.addWidget(w)
    w.showMinimized()
    bring_to_front(w, {"cmd": "activate", "env": {"XDG_ACTIVATION_TOKEN": "tok-2", "PATH": "/evil"}})
    assert w.isVisible() and not (w.windowState() & Qt.WindowState.WindowMinimized)
    assert os.environ["XDG_ACTIVATION_TOKEN"] == "tok-2" and os.environ["PATH"] != "/evil"


# ------------------------------------------------------------ the installed entry, launched twice


def wait_for(predicate, timeout: float, what: str, proc=None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the app exited ({proc.returncode}) while waiting for {what}")
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def desktop_env(tmp_path: Path, runtime_dir: Path) -> dict:
    home = tmp_path / "home"
    return {
        **os.environ,
        "HOME": str(home),
        "XDG_DATA_HOME": str(home / "share"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "XDG_RUNTIME_DIR": str(runtime_dir),
        "QT_QPA_PLATFORM": "offscreen",
        "PARLEY_STATUS_FILE": str(tmp_path / "status"),
    }


def launch_twice(argv: list[str], env: dict, tmp_path: Path) -> None:
    """Start the app as a desktop would, see it reach ready; a second launch must exit 0 at once
    and bring the first forward; SIGTERM must close the first cleanly."""
    from app.shell.single_instance import server_name

    status, log_path, data = tmp_path / "status", tmp_path / "first.log", Path(argv[argv.index("--data-dir") + 1])

    def lines():
        return status.read_text().splitlines() if status.exists() else []

    with open(log_path, "w") as log:
        first = subprocess.Popen(argv, env=env, cwd=str(tmp_path), stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: any(ln.startswith(("ready", "failed")) for ln in lines()), 180, "ready", first)
        assert lines()[0].startswith("ready "), log_path.read_text()
        sock = server_name(data)
        assert os.path.exists(sock)

        t0 = time.monotonic()
        second = subprocess.run(argv, env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
        took = time.monotonic() - t0
        assert second.returncode == 0, second.stderr
        assert "already running" in second.stderr
        assert took < 30, f"the second launch took {took:.1f}s"
        wait_for(lambda: "activated" in lines(), 30, "the first instance to be activated", first)
        assert [ln.split()[0] for ln in lines()].count("ready") == 1  # the model was loaded once

        first.send_signal(signal.SIGTERM)  # as a session logout does
        assert first.wait(timeout=60) == 0, log_path.read_text()
        assert not os.path.exists(sock)
        assert (data / "history.sqlite3").is_file()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="the freedesktop entry is for Linux/BSD desktops")
def test_installed_entry_launches_and_a_second_launch_brings_it_forward(tmp_path, tiny_model, runtime_dir):
    env = desktop_env(tmp_path, runtime_dir)
    res = subprocess.run(
        [sys.executable, str(ROOT / "packaging/linux/install_desktop.py"), "install"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    keys = parse_entry((Path(env["XDG_DATA_HOME"]) / "applications/parley.desktop").read_text(encoding="utf-8"))
    assert os.access(unescape_string(keys["TryExec"]), os.X_OK)
    argv = split_exec(keys["Exec"]) + ["--model", str(tiny_model("llava")), "--data-dir", str(tmp_path / "data")]
    launch_twice(argv, env, tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("PARLEY_BUNDLE"),
    reason="set PARLEY_BUNDLE to a built bundle's executable (make bundle: dist/Parley/parley)",
)
def test_built_bundle_launches_and_a_second_launch_brings_it_forward(tmp_path, tiny_model, runtime_dir):
    exe = Path(os.environ["PARLEY_BUNDLE"]).resolve()
    assert os.access(exe, os.X_OK), exe
    argv = [str(exe), "--model", str(tiny_model("llava")), "--data-dir", str(tmp_path / "data")]
    launch_twice(argv, desktop_env(tmp_path, runtime_dir), tmp_path)
