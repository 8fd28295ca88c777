"""Pictures: content keys, the image cache, the vision encoder and the gate between them."""

from .entry import PictureEntry, encoder_identity, picture_key  # noqa: F401
from .ram_cache import RamImageCache  # noqa: F401
