"""PDF documents: each page is a picture (PageRef) rendered with PDFium (pypdfium2).

A page's digest is derived from the document's digest, the page number and the render settings
(dpi), so a cached page is found with neither the file nor a render. A render never makes more
pixels than the model's processor uses (PixelLimit): a page is rendered at `dpi`, scaled down to
the limit. A document is checked once where it comes in (`Document.of_file`): one PictureError
sentence for an encrypted, damaged, empty or too long PDF. Torch-free.
"""

from __future__ import annotations

import io
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .file import MAX_PIXELS, PictureError
from .pdfium_process import OverLimit, PdfiumFailed, pdfium
from .ref import PictureRef, PixelLimit, captioned, check_file_digest, derived_digest, file_digest

PAGE_DOMAIN = b"parley.page.v1\0"
MAX_PAGES = 1000  # past this a "document" is no longer something to ask a chat about page by page
MAX_DOCUMENT_BYTES = 512 << 20
DEFAULT_DPI = 144  # text stays legible at this; the processor's limit lowers it where it uses fewer pixels


def _open(path: str, name: str) -> int:
    """Open the PDF in the PDFium child: its page count, or one PictureError sentence."""
    try:
        return pdfium().call("open", path)
    except PdfiumFailed as exc:
        if exc.kind == "password":
            raise PictureError(f"{name} is password-protected; save an unprotected copy to attach it") from None
        if _no_pages(path):  # PDFium refuses a page tree without a page, with a stale error code
            raise PictureError(f"{name} has no pages") from None
        raise PictureError(f"{name} is a damaged PDF (PDFium: {exc.text})") from None
    except OverLimit as exc:
        raise PictureError(exc.sentence(name)) from None


def _page_call(op: str, path: str, index: int | list[int], label: str, arg=None, timeout: float | None = None):
    """One page's load, text or render in the PDFium child, failures as one sentence naming it."""
    try:
        return pdfium().call(op, path, index, arg, timeout)
    except PdfiumFailed as exc:
        if exc.kind == "draw":
            raise PictureError(f"{label} cannot be drawn ({exc.text})") from None
        raise PictureError(f"{label} cannot be read (PDFium: {exc.text.split('PDFium: ')[-1].rstrip('.)')})") from None
    except OverLimit as exc:
        raise PictureError(exc.sentence(label)) from None


def _no_pages(source) -> bool:
    """A readable PDF whose page tree counts no page and that holds no page object."""
    try:
        with open(source, "rb") as f:
            data = f.read(1 << 20)
    except (OSError, TypeError):
        return False
    return bool(re.search(rb"/Count\s*0\b", data)) and not re.search(rb"/Type\s*/Page(?!s)\b", data)


@dataclass(frozen=True)
class Document:
    """A checked PDF: where it is, its content digest and its page count."""

    path: str
    digest: str
    pages: int

    @property
    def name(self) -> str:
        return Path(self.path).name

    @classmethod
    def of_file(cls, path: str | Path, cancelled: Callable[[], bool] | None = None) -> Document:
        """Check a PDF where it comes in: opened, and every page loaded once in the PDFium child
        (a page tree that loops, a /Count that lies, a page too costly to parse: one sentence
        now, not a failed turn later). `cancelled`: stops the hashing of a large file."""
        path = str(path)
        name = Path(path).name
        p = Path(path)
        if not p.is_file():
            raise PictureError(f"{name} was not found" if not p.exists() else f"{name} is not a file")
        size = p.stat().st_size
        if size > MAX_DOCUMENT_BYTES:
            raise PictureError(
                f"{name} is too big ({size / 2**20:.0f} MB; the limit for a PDF is {MAX_DOCUMENT_BYTES >> 20} MB)"
            )
        digest = file_digest(path, cancelled)
        n = _open(path, name)
        if n == 0:
            raise PictureError(f"{name} has no pages")
        if n > MAX_PAGES:
            raise PictureError(
                f"{name} has {n} pages; Parley reads PDFs of at most {MAX_PAGES} pages "
                "(split it, or attach the pages you need)"
            )
        _probe(path, name, n)
        return cls(path, digest, n)

    def page(self, index: int, dpi: int = DEFAULT_DPI, name: str = "") -> PageRef:
        return PageRef.of(self.path, self.digest, index, dpi, name)

    def page_refs(
        self, pages: range | list[int] | None = None, dpi: int = DEFAULT_DPI, name: str = ""
    ) -> list[PageRef]:
        """The pages as pictures; `name`: what their captions call the file ("" : only "Page N")."""
        return [self.page(i, dpi, name) for i in (range(self.pages) if pages is None else pages)]

    def text(self, pages: range | list[int] | None = None, name: str | None = None) -> str:
        """The text the PDF carries on these pages, page by page (empty for scanned pages), each
        headed by `name` (what the person calls the file; default its file name) and its page."""
        name = name or self.name
        check_file_digest(self.path, self.digest, self.name)
        parts = []
        for i in range(self.pages) if pages is None else pages:
            text = _page_call("text", self.path, i, f"{self.name}, page {i + 1}")
            if text:
                parts.append(f"[{name}, page {i + 1}]\n{text}")
        return "\n\n".join(parts)


@dataclass(frozen=True)
class PageRef(PictureRef):
    """Page `index` (0-based) of the PDF at `path`, rendered at `dpi` (within the processor's limit)."""

    document: str = ""  # the document's digest
    index: int = 0
    dpi: int = DEFAULT_DPI

    @classmethod
    def of(cls, path: str, document: str, index: int, dpi: int = DEFAULT_DPI, name: str = "") -> PageRef:
        if not (isinstance(index, int) and index >= 0):
            raise ValueError(f"not a page index: {index!r}")
        if not (isinstance(dpi, int) and 18 <= dpi <= 600):
            raise ValueError(f"a page is rendered at 18 to 600 dpi, not {dpi!r}")
        return cls(path, page_digest(document, index, dpi), document, index, dpi, name=name)

    @property
    def label(self) -> str:
        return f"{self.file_name}, page {self.index + 1}"

    @property
    def caption(self) -> str:
        # the file's name only as given (`name`), never the path's: the window stores a copy under
        # its digest, and the prompt must not differ with the way a page came in
        return captioned(self.name, f"page {self.index + 1}")

    def picture(self, limit: PixelLimit | None = None):
        check_file_digest(self.path, self.document, Path(self.path).name)
        return render_page(self.path, self.index, self.dpi, limit, self.label)

    def read_checked(self) -> bytes:
        """A PNG of the page (what a remote server is sent)."""
        buf = io.BytesIO()
        self.picture().save(buf, "PNG")
        return buf.getvalue()


def page_digest(document: str, index: int, dpi: int) -> str:
    return derived_digest(PAGE_DOMAIN, document, index, dpi)


def _probe(path: str, name: str, pages: int) -> None:
    """Load every page once (PDFium parses its content there), within PdfLimits.probe_s in all."""
    limits = pdfium().limits
    deadline = time.monotonic() + limits.probe_s
    for i in range(pages):
        left = deadline - time.monotonic()
        if left <= 0:
            raise PictureError(
                f"{name} takes longer than {limits.probe_s:g} s to open (stopped at page {i + 1} of {pages}); "
                "attach the pages you need as a smaller PDF"
            )
        _page_call("load", path, i, f"{name}, page {i + 1}", timeout=min(limits.page_s, left))


def page_sizes(path: str, indexes: list[int], name: str) -> list[tuple[float, float]]:
    """Pages' sizes in points, read from their page dictionaries (no content parsed, nothing drawn)."""
    return _page_call("size", path, indexes, f"{name} (its page sizes)")


def render_page(path: str, index: int, dpi: int, limit: PixelLimit | None, label: str):
    """RGB pixels of one page at `dpi`, scaled down to `limit`, drawn in the PDFium child."""
    from PIL import Image

    if not Path(path).is_file():
        raise PictureError(f"{label}: the file is gone; attach it again.")
    pages = _open(path, Path(path).name)
    if index >= pages:
        raise PictureError(f"{label}: the document has only {pages} pages")
    drawn = _page_call("render", path, index, label, (dpi, limit, MAX_PIXELS))
    return Image.frombytes("RGB", (drawn.width, drawn.height), drawn.rgb)
