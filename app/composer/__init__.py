"""Writing a turn: the composer and its text box, attachment chips, taking pictures, PDFs and
videos in (picture_intake, media_read off the UI thread) and their thumbnails.
May import: history and the root modules."""

from .attachment_chip import PageBudget
from .composer import Composer
from .picture_intake import PictureIntake, mime_has_pictures
from .thumbnails import ThumbnailCache

__all__ = ["Composer", "PageBudget", "PictureIntake", "ThumbnailCache", "mime_has_pictures"]
