"""Paints one message: a bubble with picture thumbnails (each marked cached or new; a page or a
frame captioned with its file's name under it), rich text, a footer of actions, and under a reply
its last-turn line (app/memory/turn_line.py).

Layout is computed by one function used for sizing, painting and hit-testing, so what is
drawn is what is clicked. Laid-out text documents are cached per (message, version, width):
scrolling through hundreds of messages re-uses them, and a streaming reply rebuilds only its
own document.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from PySide6.QtCore import QEvent, QPointF, QRect, QRectF, QSize, Qt, Signal
from PySide6.QtGui import (
    QAbstractTextDocumentLayout,
    QColor,
    QFontMetrics,
    QPainter,
    QPalette,
    QTextCursor,
    QTextDocument,
)
from PySide6.QtWidgets import QStyle, QStyledItemDelegate, QToolTip

from ..composer import ThumbnailCache
from .markdown_render import MarkdownRenderer, document_css, plain_html
from .message_model import MessageItem

MARGIN = 14  # left/right of the view
GAP = 6  # between messages
PAD = 10  # inside a bubble
THUMB = 112
MAX_TEXT_WIDTH = 820
STREAM_SLACK_LINES = 4


@dataclass
class Geometry:
    height: int
    bubble: QRectF
    thumbs: list[tuple[str, QRect]] = field(default_factory=list)
    captions: list[tuple[str, QRect]] = field(default_factory=list)  # under the thumbnails that have one
    doc_origin: QPointF = field(default_factory=QPointF)
    doc: QTextDocument | None = None
    footer_y: int = 0
    tags: str = ""
    actions: list[tuple[str, QRect]] = field(default_factory=list)  # the version switcher's parts too
    note: QRect | None = None  # where a reply's last-turn line is drawn (word-wrapped)
    versions: str = ""  # "2/3" between the switcher's arrows ("" : one version)


def mix(a: QColor, b: QColor, t: float) -> QColor:
    return QColor(
        round(a.red() * (1 - t) + b.red() * t),
        round(a.green() * (1 - t) + b.green() * t),
        round(a.blue() * (1 - t) + b.blue() * t),
    )


# "varied": regenerate once with sampling, offered while replies are greedy (a greedy repeat is the same text)
ACTION_LABELS = {"copy": "Copy", "edit": "Edit", "regenerate": "Regenerate", "varied": "More varied"}
# a message with versions: "‹ 2/3 ›", always shown; "versions" is the count between the arrows
SWITCHER = ("older", "versions", "newer")
SWITCHER_LABELS = {"older": "‹", "newer": "›"}


class MessageDelegate(QStyledItemDelegate):
    actionTriggered = Signal(str, int)  # action name (an ACTION_LABELS key), message id
    pictureClicked = Signal(str)  # absolute path
    linkClicked = Signal(str)

    def __init__(self, view):
        super().__init__(view)
        self._view = view
        self._md = MarkdownRenderer()
        self._docs: OrderedDict[int, tuple[tuple, QTextDocument]] = OrderedDict()
        # message id -> (version, width, height, the size hint): sizeHint's cache
        self._sizes: dict[int, tuple[int, int, int, QSize]] = {}
        self.thumbs = ThumbnailCache(parent=self)
        self.thumbs.ready.connect(lambda: self._view.viewport().update())
        self.hover: tuple[int, str] | None = None  # (message id, action) under the mouse
        self.doc_capacity = 400
        self.last_stream_build_ms = 0.0  # what re-rendering the streaming reply cost last time
        self._reserved: dict[int, int] = {}  # streaming message id -> height reserved for it
        self._font_key = view.font().key()
        self.offer_varied = False  # set through ChatView.offer_varied_regenerate
        # picture digest -> (badge word, tooltip) or None: memory_marks.PictureMarkBook.words
        self.picture_words: Callable[[str], tuple[str, str] | None] = lambda digest: None
        # text selected with the mouse, within one message: (message id, anchor, position) in the
        # message's document; painted by paint(), copied by ChatView (Ctrl+C, context menu)
        self.selection: tuple[int, int, int] | None = None
        self._selecting = False

    def clear_caches(self) -> None:
        self._docs.clear()
        self._sizes.clear()
        self._reserved.clear()
        self._font_key = self._view.font().key()

    # ------------------------------------------------------------ layout

    def _width(self) -> int:
        return max(200, self._view.viewport().width())

    def _item(self, index) -> tuple[MessageItem, bool]:
        """The row's item straight from our model: far cheaper than a dozen data() calls,
        which matters because the view asks every row's size on each relayout."""
        items = self._view.msg_model._items
        row = index.row()
        return items[row], row == len(items) - 1

    def _document(self, it: MessageItem, text_width: int) -> QTextDocument:
        mid = it.id
        key = (it.revision, text_width, self._font_key)
        hit = self._docs.get(mid)
        if hit is not None and hit[0] == key:
            self._docs.move_to_end(mid)
            return hit[1]
        started = time.perf_counter()
        pal = self._view.palette()
        doc = QTextDocument()
        doc.setDocumentMargin(0)
        doc.setDefaultFont(self._view.font())
        code_bg = mix(pal.color(QPalette.ColorRole.Base), pal.color(QPalette.ColorRole.Text), 0.08)
        doc.setDefaultStyleSheet(
            document_css(
                code_bg.name(),
                pal.color(QPalette.ColorRole.Text).name(),
                pal.color(QPalette.ColorRole.Link).name(),
                pal.color(QPalette.ColorRole.Mid).name(),
            )
        )
        text = it.text
        if it.role == "assistant":
            doc.setHtml(self._md.to_html(text, streaming=it.streaming))
        else:
            doc.setHtml(plain_html(text))
        doc.setTextWidth(text_width)
        if it.streaming:
            self.last_stream_build_ms = (time.perf_counter() - started) * 1000
        self._docs[mid] = (key, doc)
        if len(self._docs) > self.doc_capacity:
            self._docs.popitem(last=False)
        return doc

    def geometry(self, index, width: int | None = None) -> Geometry:
        width = width or self._width()
        it, is_last = self._item(index)
        fm = QFontMetrics(self._view.font())
        user = it.role == "user"
        inner_max = min(MAX_TEXT_WIDTH, int((width - 2 * MARGIN) * (0.8 if user else 1.0))) - 2 * PAD
        inner_max = max(80, inner_max)
        doc = self._document(it, inner_max)
        text_w = min(inner_max, int(doc.idealWidth()) + 1) if user else inner_max
        text_h = int(doc.size().height()) if it.text else 0

        pictures = it.pictures
        per_row = max(1, (inner_max + GAP) // (THUMB + GAP))
        thumb_rows = (len(pictures) + per_row - 1) // per_row
        caption_h = fm.height() if any(it.captions) else 0  # a line under each row of thumbnails
        row_h = THUMB + caption_h + GAP
        thumbs_w = min(len(pictures), per_row) * (THUMB + GAP) - GAP if pictures else 0
        thumbs_h = thumb_rows * row_h if pictures else 0

        content_w = max(text_w, thumbs_w, 24)
        content_h = thumbs_h + max(text_h, 0 if pictures else fm.height())
        bubble_w, bubble_h = content_w + 2 * PAD, content_h + 2 * PAD
        x = width - MARGIN - bubble_w if user else MARGIN
        bubble = QRectF(x, GAP, bubble_w, bubble_h)
        thumbs, captions = [], []
        for i, path in enumerate(pictures):
            r, c = divmod(i, per_row)
            box = QRect(int(x) + PAD + c * (THUMB + GAP), GAP + PAD + r * row_h, THUMB, THUMB)
            thumbs.append((path, box))
            if i < len(it.captions) and it.captions[i]:
                captions.append((it.captions[i], QRect(box.left(), box.bottom() + 1, THUMB, caption_h)))
        footer_y = GAP + bubble_h + 3
        height = footer_y + fm.height() + GAP
        note = None
        if it.note and not it.streaming:
            note_w = max(80, min(MAX_TEXT_WIDTH, width - 2 * MARGIN))
            box = fm.boundingRect(QRect(0, 0, note_w, 10_000), int(Qt.TextFlag.TextWordWrap), it.note)
            note = QRect(
                MARGIN if not user else width - MARGIN - box.width(), height - GAP + 2, box.width() + 2, box.height()
            )
            height = note.bottom() + 1 + GAP
        if it.streaming:
            # Reserve room to grow, so the list re-flows every few lines, not every token.
            reserved = self._reserved.get(it.id, 0)
            if height > reserved:
                reserved = height + STREAM_SLACK_LINES * fm.lineSpacing()
                self._reserved[it.id] = reserved
            height = reserved
        else:
            self._reserved.pop(it.id, None)
        geo = Geometry(
            height=height,
            bubble=bubble,
            thumbs=thumbs,
            captions=captions,
            doc_origin=QPointF(x + PAD, GAP + PAD + thumbs_h),
            doc=doc,
            footer_y=footer_y,
            note=note,
        )

        tags = []
        if it.streaming:
            tags.append("generating…")
        elif it.status == "interrupted":
            tags.append("stopped")
        if it.edited:
            tags.append("edited")
        geo.tags = " · ".join(tags)
        names = ["copy"]
        if user:
            names.append("edit")
        elif is_last and not it.streaming:
            names.append("regenerate")
            if self.offer_varied:
                names.append("varied")
        if it.versions:  # the switcher next to the bubble's edge, where the hidden actions do not leave a gap
            names = names + list(SWITCHER) if user else list(SWITCHER) + names
        if it.versions:
            geo.versions = f"{it.versions[0]}/{it.versions[1]}"
        # Actions sit under the bubble, on the side it is aligned to; the switcher's parts close together.
        cursor = int(bubble.right()) if user else int(bubble.left())
        spans = []
        order = names[::-1] if user else names
        for i, name in enumerate(order):
            w = fm.horizontalAdvance(self.label(geo, name)) + (8 if name in SWITCHER_LABELS else 4)
            gap = 2 if name in SWITCHER and order[i + 1 : i + 2] and order[i + 1] in SWITCHER else 10
            if user:
                cursor -= w
                spans.append((name, QRect(cursor, footer_y, w, fm.height())))
                cursor -= gap
            else:
                spans.append((name, QRect(cursor, footer_y, w, fm.height())))
                cursor += w + gap
        geo.actions = spans
        return geo

    def cached_height(self, index) -> int | None:
        """The height last measured for this row's message (any version), if any."""
        hit = self._sizes.get(self._item(index)[0].id)
        return hit[2] if hit else None

    def sizeHint(self, option, index) -> QSize:
        # Called for every row on each relayout: the cached path must stay tiny.
        it = self._view.msg_model._items[index.row()]
        width = self._view.layout_width
        hit = self._sizes.get(it.id)
        if hit is not None and hit[0] == it.revision and hit[1] == width:
            return hit[3]
        h = self.geometry(index, width).height
        self._sizes[it.id] = (it.revision, width, h, QSize(width, h))
        return QSize(width, h)

    # ------------------------------------------------------------ painting

    def paint(self, painter: QPainter, option, index) -> None:
        geo = self.geometry(index, option.rect.width() or None)
        pal = option.palette
        it, is_last = self._item(index)
        user = it.role == "user"
        mid = it.id
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.translate(option.rect.topLeft())
        base, text = pal.color(QPalette.ColorRole.Base), pal.color(QPalette.ColorRole.Text)
        if user:
            fill = mix(base, pal.color(QPalette.ColorRole.Highlight), 0.22)
        else:
            fill = mix(base, text, 0.04)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(fill)
        painter.drawRoundedRect(geo.bubble, 10, 10)

        dpr = painter.device().devicePixelRatioF() if painter.device() else 1.0
        for i, (path, rect) in enumerate(geo.thumbs):
            words = self.picture_words(it.digests[i]) if i < len(it.digests) else None
            pm = self.thumbs.get(path, THUMB, dpr)
            if pm is None:  # still decoding
                painter.setPen(Qt.PenStyle.NoPen)
                painter.setBrush(mix(base, text, 0.10))
                painter.drawRoundedRect(QRectF(rect), 6, 6)
                continue
            if pm.isNull():
                painter.setPen(pal.color(QPalette.ColorRole.PlaceholderText))
                painter.setBrush(Qt.BrushStyle.NoBrush)
                painter.drawRoundedRect(QRectF(rect), 6, 6)
                painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, "picture\nmissing")
                continue
            size = pm.deviceIndependentSize().toSize()
            target = QRect(rect.topLeft(), size)
            painter.drawPixmap(target, pm)
            if words is not None:  # on the picture itself, which may be shorter than its box
                self._paint_badge(painter, target, words[0])
        if geo.captions:
            painter.setPen(pal.color(QPalette.ColorRole.PlaceholderText))
            fm = QFontMetrics(painter.font())
            for caption, rect in geo.captions:  # the middle gives way: the file's start and the page stay
                shown = fm.elidedText(caption, Qt.TextElideMode.ElideMiddle, rect.width())
                painter.drawText(rect, int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter), shown)

        if geo.doc is not None and it.text:
            painter.save()
            painter.translate(geo.doc_origin)
            ctx = QAbstractTextDocumentLayout.PaintContext()
            ctx.palette.setColor(QPalette.ColorRole.Text, text)
            if self.selection is not None and self.selection[0] == mid:
                chosen = QAbstractTextDocumentLayout.Selection()
                chosen.cursor = self._cursor(geo.doc, self.selection)
                chosen.format.setBackground(pal.color(QPalette.ColorRole.Highlight))
                chosen.format.setForeground(pal.color(QPalette.ColorRole.HighlightedText))
                ctx.selections = [chosen]
            geo.doc.documentLayout().draw(painter, ctx)
            painter.restore()
        elif it.streaming and not it.pictures:
            painter.setPen(pal.color(QPalette.ColorRole.PlaceholderText))
            painter.drawText(geo.bubble.adjusted(PAD, PAD, -PAD, -PAD), "…")

        if geo.note is not None:
            painter.setPen(pal.color(QPalette.ColorRole.PlaceholderText))
            painter.drawText(geo.note, int(Qt.TextFlag.TextWordWrap) | int(Qt.AlignmentFlag.AlignLeft), it.note)

        footer_font = painter.font()
        painter.setFont(footer_font)
        muted = pal.color(QPalette.ColorRole.PlaceholderText)
        show_actions = bool(option.state & QStyle.StateFlag.State_MouseOver) or is_last
        if geo.tags:
            painter.setPen(muted)
            fm = QFontMetrics(footer_font)
            tag_w = fm.horizontalAdvance(geo.tags) + 4
            if user:
                left = geo.actions[-1][1].left() - 16 - tag_w if geo.actions else int(geo.bubble.right()) - tag_w
            else:
                left = (geo.actions[-1][1].right() + 16) if geo.actions else int(geo.bubble.left())
            painter.drawText(QRect(left, geo.footer_y, tag_w, fm.height()), Qt.AlignmentFlag.AlignLeft, geo.tags)
        link = pal.color(QPalette.ColorRole.Link)
        for part, rect in geo.actions:
            if part not in SWITCHER or not it.versions:
                continue
            place, count = it.versions
            at_end = (part == "older" and place == 1) or (part == "newer" and place == count)
            hovered = self.hover == (mid, part) and not at_end
            faint = mix(muted, pal.color(QPalette.ColorRole.Base), 0.6)  # an arrow with no version beyond it
            painter.setPen(link if hovered else faint if at_end else muted)
            painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, self.label(geo, part))
        if show_actions:
            for name, rect in geo.actions:
                if name in SWITCHER:
                    continue
                hovered = self.hover == (mid, name)
                f = painter.font()
                f.setUnderline(hovered)
                painter.setFont(f)
                painter.setPen(link if hovered else muted)
                painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, ACTION_LABELS[name])
            f = painter.font()
            f.setUnderline(False)
            painter.setFont(f)
        painter.restore()

    @staticmethod
    def label(geo: Geometry, name: str) -> str:
        """What a footer part says: an action's word, an arrow, or the versions' count."""
        return geo.versions if name == "versions" else SWITCHER_LABELS.get(name) or ACTION_LABELS[name]

    @staticmethod
    def _paint_badge(painter: QPainter, thumb: QRect, word: str) -> None:
        """A small dark pill in the picture's lower left corner, readable on any picture: "cached"
        in green, "new" in white."""
        fm = QFontMetrics(painter.font())
        w, h = fm.horizontalAdvance(word) + 10, fm.height() + 2
        pill = QRectF(thumb.left() + 4, thumb.bottom() - h - 3, w, h)
        painter.save()
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(QColor(20, 20, 20, 205))
        painter.drawRoundedRect(pill, h / 2, h / 2)
        painter.setPen(QColor("#7ee2a8") if word == "cached" else QColor("white"))
        painter.drawText(pill, Qt.AlignmentFlag.AlignCenter, word)
        painter.restore()

    def helpEvent(self, event, view, option, index) -> bool:
        """A thumbnail's tooltip says what the picture is (its whole caption) and whether it is
        encoded and cached."""
        if event.type() == QEvent.Type.ToolTip and index.isValid():
            tip = self.picture_tip_at(index, event.pos() - option.rect.topLeft())
            if tip:
                QToolTip.showText(event.globalPos(), tip, view)
                return True
        return super().helpEvent(event, view, option, index)

    def picture_tip_at(self, index, point) -> str:
        """The tooltip of the picture (or its caption) under a point in item coordinates, or ""."""
        it, _ = self._item(index)
        geo = self.geometry(index)
        caption_h = geo.captions[0][1].height() if geo.captions else 0
        for i, (_path, rect) in enumerate(geo.thumbs):
            if rect.adjusted(0, 0, 0, caption_h).contains(point):
                caption = it.captions[i] if i < len(it.captions) else ""
                words = self.picture_words(it.digests[i]) if i < len(it.digests) else None
                return "\n".join(t for t in (caption, words[1] if words else "") if t)
        return ""

    def picture_mark_at(self, index, point) -> tuple[str, str] | None:
        """The mark of the picture under a point in item coordinates (what the tooltip says)."""
        it, _ = self._item(index)
        for i, (_path, rect) in enumerate(self.geometry(index).thumbs):
            if rect.contains(point) and i < len(it.digests):
                return self.picture_words(it.digests[i])
        return None

    # ------------------------------------------------------------ mouse

    def hit(self, index, pos_in_item) -> tuple[str, str] | None:
        """What lies under a point: ("action", name) | ("picture", path) | ("link", href)."""
        geo = self.geometry(index)
        p = pos_in_item.toPoint() if hasattr(pos_in_item, "toPoint") else pos_in_item
        for name, rect in geo.actions:
            if rect.contains(p):
                return ("action", name)
        for path, rect in geo.thumbs:
            if rect.contains(p):
                return ("picture", path)
        if geo.doc is not None:
            href = geo.doc.documentLayout().anchorAt(QPointF(p) - geo.doc_origin)
            if href:
                return ("link", href)
        return None

    def action_rect(self, index, name: str) -> QRect | None:
        """Where an action link is drawn, in item coordinates (tests click there)."""
        for n, rect in self.geometry(index).actions:
            if n == name:
                return rect
        return None

    # ------------------------------------------------------------ selecting text with the mouse

    @staticmethod
    def _cursor(doc: QTextDocument, selection: tuple[int, int, int]) -> QTextCursor:
        last = max(0, doc.characterCount() - 1)
        cursor = QTextCursor(doc)
        cursor.setPosition(min(selection[1], last))
        cursor.setPosition(min(selection[2], last), QTextCursor.MoveMode.KeepAnchor)
        return cursor

    def selected_text(self) -> str:
        """The text selected with the mouse (plain, as it reads), or ""."""
        if self.selection is None:
            return ""
        row = next((i for i, it in enumerate(self._view.msg_model._items) if it.id == self.selection[0]), None)
        if row is None:
            return ""
        doc = self.geometry(self._view.msg_model.index(row)).doc
        return self._cursor(doc, self.selection).selection().toPlainText() if doc is not None else ""

    def clear_selection(self) -> None:
        if self.selection is not None:
            self.selection = None
            self._view.viewport().update()

    def _text_position(self, geo: Geometry, pos: QPointF, exact: bool) -> int:
        """The document position under `pos` (item coordinates); -1 off the text when `exact`."""
        if geo.doc is None or not geo.doc.characterCount() > 1:
            return -1
        accuracy = Qt.HitTestAccuracy.ExactHit if exact else Qt.HitTestAccuracy.FuzzyHit
        inside = geo.bubble.contains(pos)
        return geo.doc.documentLayout().hitTest(pos - geo.doc_origin, accuracy) if inside or not exact else -1

    def _select_event(self, event, t, index, pos: QPointF, mid: int) -> bool:
        """Press, drag and double-click on a message's text select it, as in any text view."""
        geo = self.geometry(index)
        if t == QEvent.Type.MouseButtonPress and event.button() == Qt.MouseButton.LeftButton:
            at = self._text_position(geo, pos, exact=False) if geo.bubble.contains(pos) else -1
            self.selection = (mid, at, at) if at >= 0 else None
            self._selecting = at >= 0
            self._view.viewport().update()
            return False  # a press on a link or a picture still acts on release
        if t == QEvent.Type.MouseButtonDblClick and event.button() == Qt.MouseButton.LeftButton:
            at = self._text_position(geo, pos, exact=False) if geo.bubble.contains(pos) else -1
            if at < 0 or geo.doc is None:
                return False
            cursor = QTextCursor(geo.doc)
            cursor.setPosition(at)
            cursor.select(QTextCursor.SelectionType.WordUnderCursor)
            self.selection = (mid, cursor.anchor(), cursor.position())
            self._selecting = False
            self._view.viewport().update()
            return True
        if t == QEvent.Type.MouseMove and self._selecting and event.buttons() & Qt.MouseButton.LeftButton:
            if self.selection is not None and self.selection[0] == mid:
                at = self._text_position(geo, pos, exact=False)
                if at >= 0 and at != self.selection[2]:
                    self.selection = (mid, self.selection[1], at)
                    self._view.viewport().update()
            return True
        return False

    def editorEvent(self, event, model, option, index) -> bool:
        t = event.type()
        mouse = (QEvent.Type.MouseButtonPress, QEvent.Type.MouseButtonDblClick, QEvent.Type.MouseMove)
        if t in mouse:
            item_pos = event.position() - QPointF(option.rect.topLeft())
            if self._select_event(event, t, index, item_pos, self._item(index)[0].id):
                return True
        if t == QEvent.Type.MouseButtonRelease and self._selecting:
            self._selecting = False
            if self.selection is not None and self.selection[1] != self.selection[2]:
                return True  # the end of a drag, not a click on what lies under it
            self.selection = None
        if t not in (QEvent.Type.MouseButtonRelease, QEvent.Type.MouseMove):
            return False
        pos = event.position() - QPointF(option.rect.topLeft())
        what = self.hit(index, pos)
        mid = self._item(index)[0].id
        if t == QEvent.Type.MouseMove:
            hover = (mid, what[1]) if what and what[0] == "action" else None
            if hover != self.hover:
                self.hover = hover
                self._view.viewport().update()
            pointing = what is not None
            on_text = self._text_position(self.geometry(index), pos, exact=True) >= 0
            self._view.viewport().setCursor(
                Qt.CursorShape.PointingHandCursor
                if pointing
                else (Qt.CursorShape.IBeamCursor if on_text else Qt.CursorShape.ArrowCursor)
            )
            return False
        if event.button() != Qt.MouseButton.LeftButton or what is None:
            return False
        kind, value = what
        if kind == "action":
            self.actionTriggered.emit(str(value), int(mid))
        elif kind == "picture":
            self.pictureClicked.emit(str(value))
        else:
            self.linkClicked.emit(str(value))
        return True
