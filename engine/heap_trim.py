"""Hand the C heap's free pages back to the operating system after big buffers are freed.

glibc keeps freed blocks for reuse rather than returning them, so once a turn's activations
(or released encoder weights) on the CPU are freed, the process goes on holding that memory:
more than the memory dock counts, and memory other programs could use. malloc_trim(0) returns
it; it exists only in glibc (not macOS, Windows or musl), elsewhere this does nothing.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import sys

log = logging.getLogger(__name__)


@functools.cache
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the C library this process already runs on
    except (OSError, AttributeError):  # musl and other C libraries: no such call
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def return_freed_heap() -> bool:
    """True where the C library can do it (glibc), whether or not anything was free."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
