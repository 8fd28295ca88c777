"""A dropped or attached file -> a typed attachment: a picture, a document's pages or a video's
frames, each page or frame a PictureRef. Anything else, or a bad one, is one PictureError
sentence; the caller keeps its draft and nothing else is touched. Torch-free, so the window,
`ask`, `replay` and the API take files in with the same rules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from .document import DEFAULT_DPI, Document
from .file import PICTURE_NAMES, PictureError, check, read_bytes
from .ref import PictureRef, digest_of
from .video import DEFAULT_SAMPLING, VIDEO_EXTENSIONS, FrameSampling, Video

PDF_MAGIC = b"%PDF-"


class AttachmentKind(Enum):
    PICTURE = "picture"
    DOCUMENT = "document"
    VIDEO = "video"


@dataclass(frozen=True)
class Attachment:
    """One attached file and the pictures it stands for. `document`/`video` are set for that kind."""

    kind: AttachmentKind
    name: str
    picture: PictureRef | None = None
    document: Document | None = None
    video: Video | None = None

    @property
    def digest(self) -> str:
        """BLAKE3 hex of the attached file's bytes."""
        media = self.document or self.video or self.picture
        assert media is not None, "an attachment holds a picture, a document or a video"
        return media.digest

    @property
    def count(self) -> int:
        """Pictures it can give: 1, the document's pages (frames depend on the sampling)."""
        return self.document.pages if self.document is not None else 1

    def refs(
        self,
        pages: list[int] | None = None,
        dpi: int = DEFAULT_DPI,
        sampling: FrameSampling = DEFAULT_SAMPLING,
        named: bool = False,
    ) -> list[PictureRef]:
        """The pictures to send: the chosen pages (all by default), the sampled frames, or the
        picture. `named`: their captions name the file ("report.pdf, page 3"); a file stored under
        its digest (the API's) is not named by its stored name."""
        name = self.name if named else ""
        if self.document is not None:
            return list(self.document.page_refs(pages, dpi, name))
        if self.video is not None:
            self.video.check_reach(sampling)
            return list(self.video.frame_refs(sampling, name))
        assert self.picture is not None
        return [self.picture.named(name)] if name else [self.picture]


def kind_of(path: str | Path) -> AttachmentKind:
    """What a file is, from its first bytes (a PDF) or its name (a video); else a picture."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            head = f.read(8)
    except OSError:
        head = b""
    if head.startswith(PDF_MAGIC) or (not head and p.suffix.lower() == ".pdf"):  # unreadable: its name says
        return AttachmentKind.DOCUMENT
    if p.suffix.lower() in VIDEO_EXTENSIONS:
        return AttachmentKind.VIDEO
    return AttachmentKind.PICTURE


def not_attachable(name: str) -> str:
    """The refusal for a file that is none of the kinds Parley takes: all of them named."""
    return (
        f"{name} is not a picture, PDF or video ({PICTURE_NAMES}; PDF; "
        f"{', '.join(e[1:].upper() for e in VIDEO_EXTENSIONS[:4])}…)"
    )


def attach(path: str | Path, cancelled: Callable[[], bool] | None = None) -> Attachment:
    """Check a file someone attached and type it (one PictureError sentence when it cannot be
    used). `cancelled`: stops the hashing of a large PDF or video (file.Cancelled)."""
    p = Path(path)
    name = p.name or str(p)
    kind = kind_of(p)
    if kind == AttachmentKind.DOCUMENT:
        return Attachment(kind, name, document=Document.of_file(p, cancelled))
    if kind == AttachmentKind.VIDEO:
        return Attachment(kind, name, video=Video.of_file(p, cancelled))
    data = read_bytes(str(p))
    try:
        check(data, name)
    except PictureError as exc:
        if "is not a picture" in str(exc):
            raise PictureError(not_attachable(name)) from None
        raise
    return Attachment(kind, name, picture=PictureRef(str(p), digest_of(data)))


@dataclass(frozen=True)
class AttachChoice:
    """How attached files become pictures: which pages of a PDF (1-based ranges as typed, e.g.
    "1-3, 6"; None: all), their render dpi, how a video is sampled, and whether a PDF's own text
    goes into the message alongside its pages (far fewer tokens than a picture)."""

    pages: str | None = None
    dpi: int = DEFAULT_DPI
    sampling: FrameSampling = DEFAULT_SAMPLING
    document_text: bool = False


@dataclass(frozen=True)
class AttachedFiles:
    refs: tuple[PictureRef, ...]
    text: str  # the documents' text to add to the message ("" when not offered or none)


def attach_all(paths, choice: AttachChoice = AttachChoice()) -> AttachedFiles:
    """Files named on a command line or in a replay script -> their pictures, each file checked
    and hashed once, here (one PictureError sentence for the first that cannot be used)."""
    from .picture_budget import parse_ranges

    refs: list[PictureRef] = []
    texts: list[str] = []
    for p in paths:
        if isinstance(p, PictureRef):
            refs.append(p)
            continue
        att = attach(p)
        pages = None
        if att.document is not None and choice.pages:
            try:
                pages = parse_ranges(choice.pages, att.document.pages)
            except ValueError as exc:
                raise PictureError(f"{att.name}: {exc}") from None
        refs.extend(att.refs(pages, choice.dpi, choice.sampling, named=True))  # the model is told each page's file
        if att.document is not None and choice.document_text:
            text = att.document.text(pages)
            if text:
                texts.append(text)
    return AttachedFiles(tuple(refs), "\n\n".join(texts))
