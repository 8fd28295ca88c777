"""Where memory goes, in words and marks: the Memory dock (memory_dock, memory_bar), each chat's
and picture's memory marks (memory_marks), a finished turn's one line (turn_line), and the dock
shown for a remote engine (server_panel).
May import: the root modules."""

from .memory_dock import MemoryDock
from .memory_marks import ChatMemoryMarks, Mark, PictureMarkBook
from .server_panel import ServerPanel
from .turn_line import turn_line

__all__ = ["ChatMemoryMarks", "Mark", "MemoryDock", "PictureMarkBook", "ServerPanel", "turn_line"]
