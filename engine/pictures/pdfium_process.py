"""PDFium in a child process with limits: a PDF from outside cannot take the app down with it.

PDFium parses a page's content stream with no limit of its own: a 128 KB file whose page inflates
to 50 MB of path operators took 8.9 s and 744 MB to load, and one inflating to 1 GB aborts the
process (SIGABRT) at 5-11 GB. So every PDFium call (open, page load, render, text) runs in one
persistent child process, started on first use, where:

- its address space is capped (RLIMIT_AS, POSIX; `PdfLimits.memory_bytes`): an allocation past it
  fails and PDFium aborts the child, not us;
- the parent watches its resident memory while it waits (psutil, every 50 ms, every OS: the only
  memory bound on Windows, where there is no RLIMIT_AS, and on macOS, which does not enforce it);
- each call has a deadline (`PdfLimits.page_s`); past it the child is killed.

A killed or dead child is restarted on the next call. Calls are one at a time (PDFium is not
thread-safe), so a hostile page holds other PDF reads for at most its deadline; nothing else in
the process waits on it. Measured on a 2-core EPYC: starting the child (spawn + importing
pypdfium2) takes about 0.25 s once per process; a call costs about 0.1 ms of IPC, and a rendered
page's pixels cross the pipe at about 1 GB/s. Torch-free.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import psutil


@dataclass(frozen=True)
class PdfLimits:
    """What one PDFium call may use: the child's memory (bytes) and seconds per call."""

    memory_bytes: int = 1536 << 20  # over the child's own size; a 64 MP page renders in about 700 MB
    page_s: float = 20.0  # one page's load or render
    probe_s: float = 30.0  # opening a document and loading every page it gives, at attach


@dataclass(frozen=True)
class Rendered:
    width: int
    height: int
    rgb: bytes


class PdfiumFailed(Exception):
    """PDFium refused: `kind` is password | damaged | page | draw, `text` PDFium's own words."""

    def __init__(self, kind: str, text: str):
        super().__init__(text)
        self.kind, self.text = kind, text


class OverLimit(Exception):
    """The child ran out of its memory or time on this call (and was stopped), or did not start:
    `what` is 'memory', 'time' or 'start'."""

    def __init__(self, what: str, limits: PdfLimits):
        super().__init__(what)
        self.what, self.limits = what, limits

    def sentence(self, subject: str) -> str:
        if self.what == "start":
            return f"{subject} cannot be read: Parley's PDF reader (a PDFium process) did not start"
        if self.what == "time":
            return (
                f"{subject} takes longer than {self.limits.page_s:g} s to read; Parley stopped it "
                "(a PDF made to exhaust its reader?)"
            )
        return (
            f"{subject} needs more than {self.limits.memory_bytes >> 20} MB to read; Parley stopped it "
            "(a PDF made to exhaust its reader?)"
        )


# ------------------------------------------------------------------------------ the child


def render_scale(width: float, height: float, dpi: int, limit, max_pixels: int) -> float:
    """Pixels per point for a page of width × height points drawn at `dpi`, within the
    processor's PixelLimit (None: none) and never over `max_pixels`."""
    scale = dpi / 72
    if limit is not None:
        scale *= limit.scale_for(width * scale, height * scale)
    if width * height * scale * scale > max_pixels:
        scale = (max_pixels / (width * height)) ** 0.5
    return scale


def _cap_memory(more: int) -> None:
    """Cap the address space at what the child maps now plus `more` (the child re-imports the
    parent's main module, which may have mapped torch: an absolute cap would not fit every parent)."""
    try:
        import resource
    except ImportError:  # Windows: the parent's watch is the bound
        return
    limit = psutil.Process().memory_info().vms + more
    try:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ValueError, OSError):  # macOS refuses some values; the parent still watches
        pass


def _serve(conn: Connection, memory_bytes: int) -> None:  # pragma: no cover - runs in the child
    import PIL.Image  # noqa: F401 - mapped before the cap, as pypdfium2
    import pypdfium2 as pdfium

    _cap_memory(memory_bytes)
    conn.send(("hello", psutil.Process().memory_info().rss))

    doc: Any = None
    doc_key: tuple | None = None

    def document(path: str):
        nonlocal doc, doc_key
        st = os.stat(path)
        key = (path, st.st_size, st.st_mtime_ns)
        if doc_key != key:
            if doc is not None:
                doc.close()
                doc, doc_key = None, None
            doc = pdfium.PdfDocument(path)
            doc_key = key
        return doc

    while True:
        try:
            op, path, index, arg = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if op == "open":
                try:
                    result: Any = len(document(path))
                except pdfium.PdfiumError as exc:
                    text = str(exc)
                    kind = "password" if "password" in text.lower() else "damaged"
                    conn.send(("fail", kind, text.split("PDFium: ")[-1].rstrip(".)")))
                    continue
            elif op == "size":
                result = [document(path).get_page_size(i) for i in index]
            else:
                pdf = document(path)
                try:
                    page = pdf[index]
                except pdfium.PdfiumError as exc:
                    conn.send(("fail", "page", str(exc)))
                    continue
                try:
                    if op == "load":
                        result = page.get_size()
                    elif op == "text":
                        result = page.get_textpage().get_text_bounded().strip()
                    elif op == "render":
                        dpi, limit, max_pixels = arg
                        w, h = page.get_size()
                        try:
                            scale = render_scale(w, h, dpi, limit, max_pixels)
                            image = page.render(scale=scale).to_pil().convert("RGB")
                        except pdfium.PdfiumError as exc:
                            conn.send(("fail", "draw", str(exc)))
                            continue
                        result = (image.width, image.height)
                        conn.send(("ok", result))
                        conn.send_bytes(image.tobytes())
                        continue
                    else:
                        raise ValueError(f"unknown op {op!r}")
                finally:
                    page.close()
            conn.send(("ok", result))
        except MemoryError:
            return  # the parent sees the child gone and says why
        except Exception as exc:  # one call's failure, the child lives on
            conn.send(("fail", "damaged", f"{type(exc).__name__}: {exc}"))


# ------------------------------------------------------------------------------ the parent


class PdfiumProcess:
    """The one child that runs PDFium; `call` is safe from any thread (one call at a time)."""

    def __init__(self, limits: PdfLimits = PdfLimits()):
        self.limits = limits
        self._lock = threading.Lock()
        self._proc: Any = None
        self._conn: Connection | None = None
        self.starts = 0  # children started (a restart after a kill counts)
        self._baseline = 0  # the child's resident bytes once started

    def _start(self) -> Connection:
        ctx = multiprocessing.get_context("spawn")  # no fork of a process with threads and torch
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(child, self.limits.memory_bytes), daemon=True, name="parley-pdfium")
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent
        self.starts += 1
        try:  # the child's own memory before any PDF: what the watch counts from
            if not parent.poll(60):
                raise EOFError
            self._baseline = parent.recv()[1]
        except (EOFError, OSError):
            self._stop()
            raise OverLimit("start", self.limits) from None
        return parent

    def _stop(self) -> None:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if proc is not None:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._stop()

    def call(self, op: str, path: str, index: Any = None, arg: Any = None, timeout: float | None = None) -> Any:
        """Run one PDFium call in the child: its result, PdfiumFailed, or OverLimit (the child
        is then stopped; the next call starts another)."""
        deadline_s = self.limits.page_s if timeout is None else timeout
        with self._lock:
            conn = self._conn if self._proc is not None and self._proc.is_alive() else None
            if conn is None:
                self._stop()
                conn = self._start()
            try:
                conn.send((op, path, index, arg))
                reply = self._wait(conn, time.monotonic() + deadline_s)
                if reply[0] == "fail":
                    raise PdfiumFailed(reply[1], reply[2])
                if op == "render":
                    w, h = reply[1]
                    self._wait_bytes(conn, time.monotonic() + deadline_s)
                    return Rendered(w, h, conn.recv_bytes())
                return reply[1]
            except (EOFError, OSError, BrokenPipeError):
                self._stop()
                raise OverLimit("memory", self.limits) from None
            except PdfiumFailed:
                raise
            except BaseException:  # over a limit, or interrupted (Ctrl+C) with an answer pending: a fresh child next
                self._stop()
                raise

    def _wait(self, conn: Connection, deadline: float):
        self._wait_bytes(conn, deadline)
        return conn.recv()

    def _wait_bytes(self, conn: Connection, deadline: float) -> None:
        """Wait for the child's answer, watching its memory and the deadline."""
        watch = psutil.Process(self._proc.pid)
        while not conn.poll(0.05):
            try:
                rss = watch.memory_info().rss
            except psutil.Error:
                rss = 0
            if not self._proc.is_alive() and not conn.poll(0):
                raise EOFError
            if rss - self._baseline > self.limits.memory_bytes:
                raise OverLimit("memory", self.limits)
            if time.monotonic() > deadline:
                raise OverLimit("time", self.limits)


_process: PdfiumProcess | None = None
_process_lock = threading.Lock()


def pdfium() -> PdfiumProcess:
    """The process's PDFium child (made on first use)."""
    global _process
    with _process_lock:
        if _process is None:
            _process = PdfiumProcess()
        return _process


def set_limits(limits: PdfLimits) -> PdfLimits:
    """Use other limits from the next call (the child restarts); -> the ones before. For tests
    and for a setting that trusts its files more."""
    global _process
    with _process_lock:
        old = _process.limits if _process is not None else PdfLimits()
        if _process is not None:
            _process.close()
        _process = PdfiumProcess(limits)
        return old
