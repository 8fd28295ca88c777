"""Hand the C heap's free pages back to the operating system after big buffers are freed.

glibc keeps freed blocks for reuse rather than returning them, so once a turn's activations
(or released encoder weights) on the CPU are freed, the process goes on holding that memory:
more than the memory dock counts, and memory other programs could use. malloc_trim(0) returns
it; it exists only in glibc (not macOS, Windows or musl), elsewhere this does nothing.

glibc also gives threads their own heaps ("arenas") once they contend. With them, memory after
a first picture turn exceeded the dock's total by 25-48 MiB even after malloc_trim (held, most
likely, by blocks still in use scattered through the model-owner thread's arena); with one heap
for every thread, by 6 MiB (memory_ledger --quick). The engine's threads allocate big tensors
rarely and mostly one at a time: the decode, UI-stall and image-gate benchmarks showed no
slowdown after the change.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import sys

log = logging.getLogger(__name__)


@functools.cache
def _c_library():
    if not sys.platform.startswith("linux"):
        return None
    try:
        lib = ctypes.CDLL(None)  # the C library this process already runs on
        lib.malloc_trim, lib.mallopt  # glibc only: musl and other C libraries lack malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    lib.malloc_trim.argtypes, lib.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    lib.mallopt.argtypes, lib.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return lib


M_ARENA_MAX = -8  # glibc's mallopt parameter number (malloc.h)


def keep_one_heap() -> bool:
    """Every thread allocates from one heap from now on (arenas already made stay). True where
    the C library took it (glibc)."""
    lib = _c_library()
    if lib is None:
        return False
    return lib.mallopt(M_ARENA_MAX, 1) == 1


def return_freed_heap() -> bool:
    """True where the C library can do it (glibc), whether or not anything was free."""
    lib = _c_library()
    if lib is None:
        return False
    lib.malloc_trim(0)
    return True
