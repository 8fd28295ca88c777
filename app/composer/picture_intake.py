"""Taking pictures in: files, dragged or pasted image data -> checked, stored, thumbnailed. A PDF
or a video is checked with the engine's rules (engine/pictures/attach.py) and stored the same way;
its pages or frames are what a message sends.

A picture is checked when it is attached (not when the turn runs), with the engine's own
rules: a format Pillow reads, at most 64 megapixels, fully decodable. Good ones are copied
into the history's content-addressed folder right away, so the draft no longer depends on
the original file. A rejected one yields a short reason for the composer to show.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QMimeData
from PySide6.QtGui import QImage

from engine.pictures import parts
from engine.pictures.attach import AttachmentKind, attach, kind_of, not_attachable
from engine.pictures.document import MAX_DOCUMENT_BYTES, Document
from engine.pictures.file import MAX_PIXELS, Cancelled, PictureError, check, decode_work
from engine.pictures.video import FrameSampling, Video

from ..history import History
from .thumbnails import read_scaled

MAX_FILE_BYTES = 64 << 20
MAX_VIDEO_BYTES = 4 << 30  # streamed into the store; frames are decoded one at a time
THUMB_BOX = 160
# Raw image bytes other apps put on the clipboard / in drags, best first.
_RAW_TYPES = (
    ("image/png", ".png"),
    ("image/jpeg", ".jpg"),
    ("image/webp", ".webp"),
    ("image/gif", ".gif"),
    ("image/bmp", ".bmp"),
)


@dataclass
class Attachment:
    ref: str  # the history's picture ref (a document's or video's: its stored file)
    path: str  # where the stored copy lives
    name: str  # what the user called it (file name, or "pasted picture")
    thumb: QImage
    source: str = ""  # the file's own name, which its pages' and frames' captions say ("": none, e.g. pasted)
    document: Document | None = None  # a PDF (its stored copy): its pages are the pictures
    video: Video | None = None  # a video (its stored copy): its sampled frames are the pictures
    page_range: str = ""  # what the person typed in the chip ("" = the default)


class PictureRejected(Exception):
    pass


class ReadCancelled(Exception):
    """The person removed a PDF's or video's chip while it was being read."""


@dataclass
class Intake:
    """What a drop or paste brought: pictures ready now, one reason per thing refused, and the
    PDFs and videos still to be read (hashed, copied, probed) off the UI thread."""

    found: list[Attachment] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    media: list[Path] = field(default_factory=list)


def mime_has_pictures(mime: QMimeData) -> bool:
    """Whether a drag/paste might carry pictures (files are checked only when dropped)."""
    if mime.hasImage() or any(mime.hasFormat(t) for t, _ in _RAW_TYPES):
        return True
    return mime.hasUrls() and any(u.isLocalFile() for u in mime.urls())


# A decode costs about 10 ms per megapixel per JPEG scan here (2-core EPYC): past ~50 ms (or 4 MB
# of file to read) a picture is read off the UI thread, as PDFs and videos are.
SLOW_DECODE_WORK = 5_000_000  # pixels × scans
SLOW_FILE_BYTES = 4 << 20


def slow_to_decode(path: Path) -> bool:
    """Whether a picture file would hold the UI thread long (its size, pixels and JPEG scans;
    a file that cannot be read says so later, in from_file)."""
    try:
        return path.stat().st_size > SLOW_FILE_BYTES or decode_work(path.read_bytes()) > SLOW_DECODE_WORK
    except OSError:
        return False


def check_picture_bytes(data: bytes, name: str) -> None:
    if len(data) > MAX_FILE_BYTES:
        raise PictureRejected(f"{name} is too big ({len(data) / 2**20:.0f} MB; the limit is {MAX_FILE_BYTES >> 20} MB)")
    try:
        check(data, name)  # the engine's own check: a full decode, size limit included
    except PictureError as exc:
        raise PictureRejected(str(exc)) from None


class PictureIntake:
    def __init__(self, history: History):
        self.history = history

    def from_file(self, path: str | Path) -> Attachment:
        p = Path(path)
        name = p.name or str(p)
        if not p.is_file():
            raise PictureRejected(f"{name} is not a file" if p.exists() else f"{name} was not found")
        if kind_of(p) != AttachmentKind.PICTURE:
            return self._from_media(p, name)
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise PictureRejected(f"{name} is too big ({size / 2**20:.0f} MB; the limit is {MAX_FILE_BYTES >> 20} MB)")
        try:
            data = p.read_bytes()
        except OSError as exc:
            raise PictureRejected(f"{name} cannot be read ({exc.strerror or exc})") from None
        try:
            check_picture_bytes(data, name)
        except PictureRejected as exc:  # a file attached can be a PDF or a video too: say so
            if "is not a picture" in str(exc):
                raise PictureRejected(not_attachable(name)) from None
            raise
        ref = self.history.add_picture_bytes(data, p.suffix)  # the bytes just checked; no second read
        return self._attachment(ref, name, name)

    def is_media(self, path: str | Path) -> bool:
        """A PDF, a video or a picture slow to decode: reading one takes seconds (see from_media),
        so the window does it off the UI thread. Reads only the file's first bytes (a picture's
        header, and a JPEG's scan count)."""
        p = Path(path)
        return p.is_file() and (kind_of(p) != AttachmentKind.PICTURE or slow_to_decode(p))

    def from_media(self, path: str | Path, cancelled: threading.Event | None = None) -> Attachment:
        """Read a PDF or a video: hash it, probe it, copy it into the store, thumbnail its first
        page or frame (a picture slow to decode: as from_file). A gigabyte clip takes seconds, so
        this runs off the UI thread (app/composer/media_read.py); ReadCancelled when `cancelled` is set
        before the copy."""
        p = Path(path)
        if kind_of(p) == AttachmentKind.PICTURE:
            return self.from_file(p)
        return self._from_media(p, p.name or str(p), cancelled)

    def _from_media(self, p: Path, name: str, cancelled: threading.Event | None = None) -> Attachment:
        """A PDF or a video: its size checked first (a 5 GB clip is refused before it is hashed),
        then checked with the engine's rules, then its bytes stored like a picture's (the draft no
        longer depends on the original file)."""
        limit = MAX_DOCUMENT_BYTES if kind_of(p) == AttachmentKind.DOCUMENT else MAX_VIDEO_BYTES
        try:
            size = p.stat().st_size
        except OSError as exc:
            raise PictureRejected(f"{name} cannot be read ({exc.strerror or exc})") from None
        if size > limit:
            raise PictureRejected(f"{name} is too big ({size / 2**20:.0f} MB; the limit is {limit >> 20} MB)")
        try:
            att = attach(p, cancelled.is_set if cancelled is not None else None)
        except Cancelled:
            raise ReadCancelled(name) from None
        except PictureError as exc:
            raise PictureRejected(str(exc)) from None
        if att.video is not None:  # a clip whose frames lie too far past a key frame: now, not at send
            try:
                att.video.check_reach(FrameSampling())
            except PictureError as exc:
                raise PictureRejected(str(exc)) from None
        if cancelled is not None and cancelled.is_set():
            raise ReadCancelled(name)
        try:
            ref = self.history.add_file(p, att.digest)
        except OSError as exc:
            raise PictureRejected(f"{name} cannot be read ({exc.strerror or exc})") from None
        stored = str(self.history.picture_path(ref))
        document = replace(att.document, path=stored) if att.document is not None else None
        video = replace(att.video, path=stored) if att.video is not None else None
        first = parts.page_name(ref, 0, 72) if document is not None else parts.frame_name(ref, 0.0, FrameSampling())
        thumb = read_scaled(self.history.thumbnail_source(first), THUMB_BOX)
        return Attachment(ref, stored, name, thumb, name, document=document, video=video)

    def from_bytes(self, data: bytes, extension: str, name: str) -> Attachment:
        check_picture_bytes(data, name)
        ref = self.history.add_picture_bytes(data, extension)
        return self._attachment(ref, name)

    def from_image(self, image: QImage, name: str = "pasted picture") -> Attachment:
        if image.isNull():
            raise PictureRejected(f"The {name} is empty")
        if image.width() * image.height() > MAX_PIXELS:
            raise PictureRejected(f"The {name} is too large ({image.width()}×{image.height()} pixels)")
        buf = QByteArray()
        dev = QBuffer(buf)
        dev.open(QIODevice.OpenModeFlag.WriteOnly)
        # the stubs type format as bytes, but PySide6 6.12 rejects b"PNG" at runtime and takes a str
        image.save(dev, "PNG")  # type: ignore[call-overload]
        dev.close()
        return self.from_bytes(bytes(buf.data()), ".png", name)

    def from_mime(self, mime: QMimeData, verb: str = "dropped") -> Intake:
        """Everything usable in a drop or paste, a reason for each thing refused, and the PDFs and
        videos for the caller to read off the UI thread (from_media)."""
        taken = Intake()
        found, errors = taken.found, taken.errors
        urls = [u for u in mime.urls()] if mime.hasUrls() else []
        local = [u.toLocalFile() for u in urls if u.isLocalFile()]
        if urls and not local:
            errors.append("Only pictures on this computer can be attached (not web links)")
        for path in local:
            if self.is_media(path):
                taken.media.append(Path(path))
                continue
            try:
                found.append(self.from_file(path))
            except PictureRejected as exc:
                errors.append(str(exc))
        if local:
            return taken
        for mime_type, ext in _RAW_TYPES:  # the sender's own bytes beat a re-encode
            if mime.hasFormat(mime_type):
                try:
                    found.append(self.from_bytes(bytes(mime.data(mime_type).data()), ext, f"{verb} picture"))
                except PictureRejected as exc:
                    errors.append(str(exc))
                return taken
        if mime.hasImage():
            image = mime.imageData()
            try:
                found.append(self.from_image(QImage(image), f"{verb} picture"))
            except (PictureRejected, TypeError) as exc:
                errors.append(str(exc))
        return taken

    def restore(self, ref: str, name: str = "") -> Attachment:
        """An attachment for a picture already stored (editing a sent message), `name`: its file's."""
        return self._attachment(ref, name or ref[:8], name)

    def _attachment(self, ref: str, name: str, source: str = "") -> Attachment:
        path = str(self.history.picture_path(ref))
        return Attachment(ref, path, name, read_scaled(self.history.thumbnail_source(ref), THUMB_BOX), source)
