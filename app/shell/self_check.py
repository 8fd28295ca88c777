"""`parley --self-check`: does this installation work? Run from a checkout or from the bundle
(`make bundle-check`), it imports every module of app/ and engine/, loads the built-in demo model,
asks it one question each about a picture, a PDF page and a video frame, and opens the window
offscreen and closes it. One line per check; exit 0 only when every check passed. A module the
bundle lacks is named in its line (`No module named 'av'`), which is the failure a frozen app
shows first. Everything it writes lives in a temporary folder: the user's history, settings and
caches are not touched."""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

PACKAGES = ("app", "engine")
QUESTION = "What colour is the square?"
MODEL_S = 300.0  # a load or a turn of the demo model takes about a second; this bounds a hang
WINDOW_S = 120.0


class CheckFailed(Exception):
    """A check ran and found something wrong: its line says what."""


@dataclass(frozen=True)
class Outcome:
    name: str
    ok: bool
    detail: str
    seconds: float

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'}  {self.name:<12} {self.detail} ({self.seconds:.1f} s)"


def _why(exc: BaseException) -> str:
    """One line: a missing module by name, else the exception and where it was raised."""
    if isinstance(exc, ModuleNotFoundError):
        return f"missing module {exc.name!r}: {exc}"
    if isinstance(exc, CheckFailed):
        return str(exc)
    where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    at = f" at {Path(where[0].filename).name}:{where[0].lineno}" if where else ""
    return f"{type(exc).__name__}: {exc}{at}"


def module_names(package: str, failures: dict[str, BaseException]) -> list[str]:
    """Every module of `package`, subpackages included (a subpackage that fails to import is
    recorded in `failures`, and its own modules cannot be listed)."""
    pkg = importlib.import_module(package)
    names = [package]

    def onerror(name: str) -> None:
        failures[name] = sys.exc_info()[1] or ImportError(f"cannot import {name}")

    for info in pkgutil.walk_packages(pkg.__path__, package + ".", onerror=onerror):
        names.append(info.name)
    return names


def check_imports() -> str:
    failures: dict[str, BaseException] = {}
    names: list[str] = []
    for package in PACKAGES:
        names += module_names(package, failures)
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - each failure is reported by module name
            failures[name] = exc
    if failures:
        first = sorted(failures)[0]
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise CheckFailed(f"{first}: {_why(failures[first])}{more}")
    return f"{len(names)} modules of {' and '.join(p + '/' for p in PACKAGES)}"


# ------------------------------------------------------------------------------ sample files


def _square(size: tuple[int, int] = (128, 128)):
    """A red square in the middle of a white picture: what the demo model was trained to see."""
    from PIL import Image, ImageDraw

    im = Image.new("RGB", size, "white")
    w, h = size
    ImageDraw.Draw(im).rectangle([w // 4, h // 4, 3 * w // 4, 3 * h // 4], fill="red")
    return im


def write_picture(folder: Path) -> Path:
    path = folder / "square.png"
    _square().save(path)
    return path


def write_pdf(folder: Path) -> Path:
    """One page, a red square on white, written by hand (PDFium in its child process renders it)."""
    body = b"1 0 0 rg 50 50 100 100 re f"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 200] /Contents 4 0 R /Resources << >> >>",
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(body), body),
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, obj in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (i, obj)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % off for off in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    path = folder / "square.pdf"
    path.write_bytes(bytes(out))
    return path


def write_video(folder: Path) -> Path:
    """One second of the red square, encoded with PyAV (its FFmpeg decodes it back)."""
    import av
    import numpy as np

    path = folder / "square.mp4"
    fps = 4
    pixels = np.asarray(_square(), dtype=np.uint8)
    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=fps)
        stream.width, stream.height = pixels.shape[1], pixels.shape[0]
        stream.pix_fmt = "yuv420p"
        stream.time_base = Fraction(1, fps)
        for i in range(fps):
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            frame.pts = i
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
    return path


# ------------------------------------------------------------------------------ the engine


class EngineChecks:
    """The built-in engine on the demo model, in a data folder of its own."""

    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self.engine = None

    def load(self) -> str:
        from engine.local.engine import Engine
        from engine.platform.paths import DEMO_MODEL
        from engine.protocol.client import load_blocking
        from engine.protocol.settings import EngineSettings

        if not (DEMO_MODEL / "config.json").is_file():
            raise CheckFailed(f"the demo model is missing: {DEMO_MODEL}")
        engine = self.engine = Engine(EngineSettings(), self.data_dir / "engine").start()
        ready = load_blocking(engine, str(DEMO_MODEL), timeout=MODEL_S)
        return f"{ready.name} ({ready.family}, {ready.dtype}) on {ready.device}"

    def ask(self, path: Path, conversation: str) -> str:
        from engine.pictures.attach import AttachChoice, attach_all
        from engine.pictures.video import FrameSampling
        from engine.protocol.client import run_blocking
        from engine.protocol.events import Message, Sampling, Turn, TurnFailed

        if self.engine is None:
            raise CheckFailed("no model: its load failed")
        files = attach_all([str(path)], AttachChoice(pages="1", sampling=FrameSampling(fps=1.0, max_frames=1)))
        if len(files.refs) != 1:
            raise CheckFailed(f"{path.name} gave {len(files.refs)} pictures, not 1")
        sampling = Sampling(greedy=True, max_new_tokens=24)
        turn = Turn(conversation, [Message("user", QUESTION, list(files.refs))], sampling, None)
        result = run_blocking(self.engine, turn, timeout=MODEL_S)
        if isinstance(result, TurnFailed):
            raise CheckFailed(result.message)
        reply = result.reply.strip()
        if "red" not in reply.lower():  # the picture reached the model: it names the square's colour
            raise CheckFailed(f"{QUESTION!r} was answered {reply!r}, which does not name red")
        return repr(reply)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown(30.0)


# ------------------------------------------------------------------------------ the window


def check_window(data_dir: Path) -> str:
    """The window as a user gets it, offscreen: shown, the demo model loaded into it, closed."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QEventLoop, QSettings, QTimer

    from engine.platform.paths import DEMO_MODEL
    from engine.protocol.settings import EngineSettings

    from ..connection import EngineBridge
    from ..history import History
    from ..settings import Preferences
    from ..theme import apply_theme
    from .main import make_application
    from .main_window import MainWindow

    app = make_application(["parley"])
    settings = QSettings(str(data_dir / "settings.ini"), QSettings.Format.IniFormat)
    prefs = Preferences(settings)  # not the user's settings
    apply_theme(app, prefs.theme())
    history = History(data_dir / "window")
    bridge = EngineBridge.create(EngineSettings(), data_dir / "window", start=False)
    window = MainWindow(bridge, history, prefs, data_dir / "window")
    outcome: dict[str, str] = {}
    loop = QEventLoop()

    def ended(what: str) -> None:
        outcome.setdefault("how", what)
        loop.quit()

    bridge.modelReady.connect(lambda ev: ended(f"ready {ev.name}"))
    bridge.modelFailed.connect(lambda ev: ended(f"failed: {ev.message}"))
    deadline = QTimer()
    deadline.setSingleShot(True)
    deadline.timeout.connect(lambda: ended(f"no model after {WINDOW_S:.0f} s"))
    try:
        window.show()
        window.load_model(str(DEMO_MODEL))
        bridge.start()
        deadline.start(int(WINDOW_S * 1000))
        loop.exec()
        shown = window.isVisible()
        window.close()
    finally:
        deadline.stop()
        window.shutdown()
    how = outcome.get("how", "")
    if not shown:
        raise CheckFailed("the window was not shown")
    if not how.startswith("ready"):
        raise CheckFailed(f"the window's model: {how}")
    return f"shown offscreen, model {how[len('ready ') :]}, closed"


# ------------------------------------------------------------------------------ all of it


def _timed(name: str, fn: Callable[[], str]) -> Outcome:
    start = time.perf_counter()
    try:
        detail, ok = fn(), True
    except Exception as exc:  # noqa: BLE001 - a self-check reports every failure as its line
        detail, ok = _why(exc), False
    return Outcome(name, ok, detail, time.perf_counter() - start)


def run(out=None) -> int:
    """Every check, each line printed as it ends; 0 when all passed, else 1."""
    out = out or sys.stdout
    outcomes: list[Outcome] = []

    def report(outcome: Outcome) -> None:
        outcomes.append(outcome)
        print(outcome.line(), file=out, flush=True)

    report(_timed("imports", check_imports))
    with tempfile.TemporaryDirectory(prefix="parley-self-check-") as tmp:
        folder = Path(tmp)
        engine = EngineChecks(folder)
        try:
            report(_timed("model", engine.load))
            report(_timed("picture", lambda: engine.ask(write_picture(folder), "picture")))
            report(_timed("pdf page", lambda: engine.ask(write_pdf(folder), "pdf")))
            report(_timed("video frame", lambda: engine.ask(write_video(folder), "video")))
        finally:
            engine.close()
        report(_timed("window", lambda: check_window(folder)))
    failed = [o.name for o in outcomes if not o.ok]
    if failed:
        print(f"self-check FAILED: {', '.join(failed)}", file=out, flush=True)
        return 1
    print(f"self-check passed: {len(outcomes)} checks", file=out, flush=True)
    return 0
