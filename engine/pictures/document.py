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
import threading
from dataclasses import dataclass
from pathlib import Path

import pypdfium2 as pdfium

from .file import MAX_PIXELS, PictureError
from .ref import PictureRef, PixelLimit, check_file_digest, derived_digest, file_digest

PAGE_DOMAIN = b"parley.page.v1\0"
MAX_PAGES = 1000  # past this a "document" is no longer something to ask a chat about page by page
MAX_DOCUMENT_BYTES = 512 << 20
DEFAULT_DPI = 144  # text stays legible at this; the processor's limit lowers it where it uses fewer pixels
# PDFium is not thread-safe: one render or text read at a time in the process
_PDFIUM = threading.Lock()


def _open(source, name: str) -> pdfium.PdfDocument:
    try:
        return pdfium.PdfDocument(source)
    except pdfium.PdfiumError as exc:
        text = str(exc)
        if "password" in text.lower():
            raise PictureError(f"{name} is password-protected; save an unprotected copy to attach it") from None
        if _no_pages(source):  # PDFium refuses a page tree without a page, with a stale error code
            raise PictureError(f"{name} has no pages") from None
        raise PictureError(f"{name} is a damaged PDF (PDFium: {text.split('PDFium: ')[-1].rstrip('.)')})") from None


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
    def of_file(cls, path: str | Path) -> Document:
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
        digest = file_digest(path)
        with _PDFIUM:
            pdf = _open(path, name)
            try:
                n = len(pdf)
            finally:
                pdf.close()
        if n == 0:
            raise PictureError(f"{name} has no pages")
        if n > MAX_PAGES:
            raise PictureError(
                f"{name} has {n} pages; Parley reads PDFs of at most {MAX_PAGES} pages "
                "(split it, or attach the pages you need)"
            )
        return cls(path, digest, n)

    def page(self, index: int, dpi: int = DEFAULT_DPI) -> PageRef:
        return PageRef.of(self.path, self.digest, index, dpi)

    def page_refs(self, pages: range | list[int] | None = None, dpi: int = DEFAULT_DPI) -> list[PageRef]:
        return [self.page(i, dpi) for i in (range(self.pages) if pages is None else pages)]

    def text(self, pages: range | list[int] | None = None, name: str | None = None) -> str:
        """The text the PDF carries on these pages, page by page (empty for scanned pages), each
        headed by `name` (what the person calls the file; default its file name) and its page."""
        name = name or self.name
        check_file_digest(self.path, self.digest, self.name)
        parts = []
        with _PDFIUM:
            pdf = _open(self.path, self.name)
            try:
                for i in range(self.pages) if pages is None else pages:
                    tp = pdf[i].get_textpage()
                    text = tp.get_text_bounded().strip()
                    if text:
                        parts.append(f"[{name}, page {i + 1}]\n{text}")
            finally:
                pdf.close()
        return "\n\n".join(parts)


@dataclass(frozen=True)
class PageRef(PictureRef):
    """Page `index` (0-based) of the PDF at `path`, rendered at `dpi` (within the processor's limit)."""

    document: str = ""  # the document's digest
    index: int = 0
    dpi: int = DEFAULT_DPI

    @classmethod
    def of(cls, path: str, document: str, index: int, dpi: int = DEFAULT_DPI) -> PageRef:
        if not (isinstance(index, int) and index >= 0):
            raise ValueError(f"not a page index: {index!r}")
        if not (isinstance(dpi, int) and 18 <= dpi <= 600):
            raise ValueError(f"a page is rendered at 18 to 600 dpi, not {dpi!r}")
        return cls(path, page_digest(document, index, dpi), document, index, dpi)

    @property
    def label(self) -> str:
        return f"{Path(self.path).name}, page {self.index + 1}"

    @property
    def caption(self) -> str:
        # no file name: the window stores a copy under its digest, and the prompt must not differ
        # with the way a page came in
        return f"Page {self.index + 1}:"

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


def render_page(path: str, index: int, dpi: int, limit: PixelLimit | None, label: str):
    """RGB pixels of one page at `dpi`, scaled down to `limit`."""
    with _PDFIUM:
        pdf = _open(path, Path(path).name)
        try:
            if index >= len(pdf):
                raise PictureError(f"{label}: the document has only {len(pdf)} pages")
            page = pdf[index]
            w, h = page.get_size()  # points: 1/72 inch
            scale = dpi / 72
            if limit is not None:
                scale *= limit.scale_for(w * scale, h * scale)
            if w * h * scale * scale > MAX_PIXELS:
                scale = (MAX_PIXELS / (w * h)) ** 0.5
            try:
                return page.render(scale=scale).to_pil().convert("RGB")
            except pdfium.PdfiumError as exc:
                raise PictureError(f"{label} cannot be drawn ({exc})") from None
        finally:
            pdf.close()
