"""Screenshots of the real Parley window, for the README (docs/screenshots/).

Drives the real MainWindow through its real widgets, with a real Engine running the given model
(the built-in demo "Parley Shapes" by default), a throwaway data folder and throwaway settings
(nothing of the user's is read or written). The pictures are drawn with packaging/demo_model/shapes_world.py,
so they are the kind the demo model knows; every reply in the screenshots is the model's own
streamed output.

    xvfb-run -a -s "-screen 0 1400x900x24" .venv/bin/python packaging/screenshots.py --out docs/screenshots

Needs a real display server (QT_QPA_PLATFORM=xcb under Xvfb, set here unless already set);
`offscreen` works too but is not what users see. Writes:

  empty.png     a fresh window, the model loaded, no conversation yet
  chat.png      two turns, each with a picture dropped on the composer, and the model's replies
  chat-dark.png chat.png in the dark theme (chat-light.png with --theme dark)
  memory.png    the same, with the memory dock: weights, encoder, hot KV, image cache, counters,
                the last turn's timings
  bad-drop.png  a 6-page PDF (one chip with its page count and range), then an empty PDF and a
                damaged PNG dropped next to it, a good picture and a draft: the inline refusal,
                with the draft, the picture and the document kept
  versions.png  the last question edited and answered: "‹ 2/2 ›" under it switches back to the
                first version and its reply

The replies and what the pictures show are printed, so a wrong answer is easy to spot.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "packaging" / "demo_model"))
os.environ.setdefault("QT_QPA_PLATFORM", "xcb")

# isort: off
import app  # noqa: E402,F401  (the PySide6 refcount workaround, before any other Qt use)

# isort: on
import shapes_world as world  # noqa: E402
from PySide6.QtCore import QEventLoop, QMimeData, QPointF, QSettings, Qt, QTimer, QUrl  # noqa: E402
from PySide6.QtGui import QDragEnterEvent, QDragMoveEvent, QDropEvent  # noqa: E402
from PySide6.QtTest import QTest  # noqa: E402
from PySide6.QtWidgets import QApplication, QScrollArea, QWidget  # noqa: E402
from shapes_questions import describe  # noqa: E402

from app.connection.bridge import EngineBridge  # noqa: E402
from app.history.history import History  # noqa: E402
from app.settings.preferences import Preferences  # noqa: E402
from app.shell.main import make_application  # noqa: E402
from app.shell.main_window import MainWindow  # noqa: E402
from app.theme import apply_theme  # noqa: E402
from engine.platform.paths import DEMO_MODEL  # noqa: E402
from tests.fixtures.documents import make_empty_pdf, make_pdf  # noqa: E402

WINDOW = (1360, 860)
LOAD_TIMEOUT_S = 180
TURN_TIMEOUT_S = 180


# ---------------------------------------------------------------- pictures (in the demo's world)


def shape(kind: str, colour: str, cell: int, half: float, angle: float = 0.0) -> world.Obj:
    r, c = divmod(cell, 3)
    return world.Obj(kind, colour, cell, (c + 0.5) / 3, (r + 0.5) / 3, half, angle)


SCENES = {
    # three shapes on white: "What is in the picture?"
    "shapes.png": world.Scene(
        [shape("circle", "red", 0, 0.12), shape("square", "blue", 5, 0.12), shape("triangle", "green", 7, 0.13)],
        ["white"],
    ),
    # a second picture, two shapes on grey: "What about this one?"
    "more-shapes.png": world.Scene([shape("star", "yellow", 2, 0.14, 6), shape("heart", "purple", 3, 0.13)], ["grey"]),
    # the good picture kept next to the refused files
    "star.png": world.Scene([shape("star", "orange", 4, 0.3)], ["black"]),
}


def draw_pictures(folder: Path) -> dict[str, Path]:
    out = {}
    for i, (name, scene) in enumerate(SCENES.items()):
        path = folder / name
        world.render(scene, random.Random(100 + i), size=(256, 256)).save(path)
        out[name] = path
    return out


def not_pictures(folder: Path) -> list[Path]:
    pdf = make_empty_pdf(folder / "report.pdf")  # a PDF with no pages: nothing to show the model
    good = folder / "whole.png"
    world.render(SCENES["shapes.png"], random.Random(7), size=(256, 256)).save(good)
    cut = folder / "cut.png"
    data = good.read_bytes()
    cut.write_bytes(data[: len(data) // 2])  # a download that stopped half way
    return [pdf, cut]


# ---------------------------------------------------------------- driving the window


def settle(ms: int) -> None:
    """Run the event loop for `ms` milliseconds (layouts, repaints, queued engine events)."""
    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def wait_until(cond, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"screenshots: timed out waiting for {what}")
        settle(50)


def drop_files(widget: QWidget, paths: list[Path]) -> bool:
    """Drag enter, move and drop file URLs on `widget`, as the platform delivers a real drop."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    pos = QPointF(widget.width() / 2, widget.height() / 2)
    args = (Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    enter = QDragEnterEvent(pos, *args)
    QApplication.sendEvent(widget, enter)
    if not enter.isAccepted():
        return False
    QApplication.sendEvent(widget, QDragMoveEvent(pos, *args))
    drop = QDropEvent(pos, *args)
    QApplication.sendEvent(widget, drop)
    return drop.isAccepted()


def type_text(w: MainWindow, text: str) -> None:
    w.composer.edit.setFocus()
    QTest.keyClicks(w.composer.edit, text)


def ask(w: MainWindow, picture: Path, question: str, done: list) -> str:
    """Drop a picture on the composer, type the question, press Enter; wait for the whole reply."""
    if not drop_files(w.composer.edit.viewport(), [picture]):
        raise SystemExit(f"screenshots: the composer refused the drop of {picture}")
    settle(200)
    if [a.name for a in w.composer.attachments()] != [picture.name]:
        raise SystemExit(f"screenshots: {picture.name} was not attached ({w.composer.problem.text()})")
    type_text(w, question)
    n = len(done)
    QTest.keyClick(w.composer.edit, Qt.Key.Key_Return)
    wait_until(lambda: len(done) > n and not w.controller.is_generating(), TURN_TIMEOUT_S, "the reply")
    settle(400)
    return w.messages.items()[-1].text


def set_theme(qapp: QApplication, w: MainWindow, theme: str) -> None:
    w.prefs.set_theme(theme)
    apply_theme(qapp, theme)
    w.refresh_icons()


def show_whole_dock(w: MainWindow) -> None:
    """Widen the memory dock to its content (as a user drags its edge) and make the window tall
    enough for all of it, so weights, encoder, KV, caches, counters and the last turn show at once.
    The window may be taller than the screen: QWidget.grab renders it all the same."""
    scroll = w.memory_dock.widget()
    if not isinstance(scroll, QScrollArea) or (body := scroll.widget()) is None:
        raise SystemExit("screenshots: the memory dock no longer holds its body in a scroll area")
    frame = 2 * scroll.frameWidth()
    want_w = body.minimumSizeHint().width() + frame + 8
    if w.memory_dock.width() < want_w:
        w.resizeDocks([w.memory_dock], [want_w], Qt.Orientation.Horizontal)
    settle(200)
    missing = body.sizeHint().height() + frame - scroll.height()
    if missing > 0:
        w.resize(w.width(), w.height() + missing)
    settle(300)


def grab(w: MainWindow, path: Path) -> None:
    settle(600)  # thumbnails decode on the thread pool; the dock refreshes at 4 Hz
    w.repaint()
    pm = w.grab()
    if pm.isNull() or not pm.save(str(path)):
        raise SystemExit(f"screenshots: could not save {path}")
    print(f"wrote {path} ({pm.width()}x{pm.height()})", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(DEMO_MODEL), help="model folder (default: the demo model)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "screenshots"), help="where to write the PNGs")
    ap.add_argument(
        "--size",
        default=f"{WINDOW[0]}x{WINDOW[1]}",
        help="window size WxH (e.g. 1280x720 under a 1280x720 Xvfb screen: a small laptop)",
    )
    ap.add_argument(
        "--theme",
        default="light",
        choices=["light", "dark"],
        help="theme of the screenshots (chat.png is also taken in the other one)",
    )
    args = ap.parse_args(argv)
    window = tuple(int(n) for n in args.size.lower().split("x"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if os.environ["QT_QPA_PLATFORM"] == "xcb" and not os.environ.get("DISPLAY"):
        print("screenshots: no X display; run under xvfb-run (see the top of this file)", file=sys.stderr)
        return 2

    qapp = make_application(["parley"])
    with tempfile.TemporaryDirectory(prefix="parley-shots-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "in").mkdir()
        pictures = draw_pictures(tmp / "in")
        refused = not_pictures(tmp / "in")
        prefs = Preferences(QSettings(str(tmp / "settings.ini"), QSettings.Format.IniFormat))
        prefs.set_theme(args.theme)
        apply_theme(qapp, args.theme)
        data_dir = tmp / "data"
        history = History(data_dir)
        bridge = EngineBridge.create(prefs.engine_settings(), data_dir)
        w = MainWindow(bridge, history, prefs, data_dir)
        done: list = []
        failed: list = []
        bridge.turnDone.connect(done.append)
        bridge.turnFailed.connect(lambda ev: failed.append(ev))
        bridge.modelFailed.connect(lambda ev: failed.append(ev))
        try:
            w.resize(*window)
            w.move(0, 0)
            w.show()
            w.activateWindow()
            w.load_model(args.model)
            wait_until(lambda: w.model_ready or failed, LOAD_TIMEOUT_S, "the model")
            if failed:
                raise SystemExit(f"screenshots: {failed[0]}")
            wait_until(lambda: w.memory_dock.report is not None, 30, "a memory report")
            w.composer.edit.setFocus()
            grab(w, out / "empty.png")

            w.memory_dock.hide()  # the conversation gets the room; the dock has its own screenshot
            turns = [
                (pictures["shapes.png"], "What is in the picture?"),
                (pictures["more-shapes.png"], "What about this one?"),
            ]
            for (picture, question), scene in zip(turns, SCENES.values(), strict=False):
                reply = ask(w, picture, question, done)
                if failed:
                    raise SystemExit(f"screenshots: {failed[0]}")
                drawn = describe(scene)
                print(
                    f"{question!r} on {picture.name}: {reply!r}"
                    + ("" if reply == drawn else f"  <- WARNING: the picture shows {drawn!r}"),
                    flush=True,
                )
            grab(w, out / "chat.png")
            other = "dark" if args.theme == "light" else "light"
            set_theme(qapp, w, other)  # as Settings ▸ Theme does
            grab(w, out / f"chat-{other}.png")
            set_theme(qapp, w, args.theme)

            w.memory_dock.show()
            n_reports = [0]
            bridge.memoryReport.connect(lambda _r: n_reports.__setitem__(0, n_reports[0] + 1))
            wait_until(lambda: n_reports[0] >= 2, 30, "fresh memory reports")
            w.memory_dock.refresh_now()
            settle(300)
            show_whole_dock(w)
            grab(w, out / "memory.png")
            w.resize(*window)

            w.memory_dock.hide()
            type_text(w, "How many shapes are there?")
            drop_files(w.composer.edit.viewport(), [pictures["star.png"], make_pdf(tmp / "in" / "notes.pdf", 6)])
            wait_until(lambda: not w.composer.reading(), 30, "the PDF to be read")
            drop_files(w.composer.edit.viewport(), refused)
            wait_until(lambda: not w.composer.reading() and w.composer.problem.isVisible(), 30, "the refusal")
            settle(200)
            problem = w.composer.problem.text()
            kept = [a.name for a in w.composer.attachments()]
            print(f"refusal: {problem!r}; kept {kept} and the draft {w.composer.text()!r}", flush=True)
            if not w.composer.problem.isVisible() or kept != ["star.png", "notes.pdf"]:
                raise SystemExit("screenshots: the refusal did not show as expected")
            grab(w, out / "bad-drop.png")

            w.composer.clear()
            asked = [m for m in w.controller.stored_messages() if m.role == "user"][-1]
            # the last question edited, as Edit ▸ Send does: the old one stays as version 1, with its reply
            w.controller.edit_and_resend(asked.id, "Where is the heart?", asked.named_pictures())
            wait_until(lambda: not w.controller.is_generating(), 60, "the edited question's reply")
            print(f"edited: {w.messages.items()[-1].text!r}", flush=True)
            settle(300)
            grab(w, out / "versions.png")
        finally:
            w.close()  # as the user would: the engine stops, the history closes
            settle(100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
