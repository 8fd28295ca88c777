"""Work around a PySide6 6.12 reference-count bug on Python < 3.12.

Under PySide6 6.12.0, every Signal.emit() drops one reference to True, and every queued slot
call drops one to None, that it never took. On Python 3.12+ these objects are immortal and
nothing happens; on 3.11 the count reaches zero after a few thousand emits and the process
aborts ("deallocating True or False" / "deallocating None"). A streaming chat emits far more.

The fix makes None, True and False effectively immortal, as Python 3.12 does, by raising their
counts by 2**40 once. It is applied only when a probe shows the leak, so a fixed PySide6 or a
newer Python leaves everything untouched.
"""

from __future__ import annotations

import ctypes
import sys

_BUMP = 1 << 40
applied = False


def _leaks() -> bool:
    from PySide6.QtCore import QObject, Signal

    class _Probe(QObject):
        ping = Signal()

    probe = _Probe()
    probe.ping.connect(lambda: None)
    before = sys.getrefcount(True), sys.getrefcount(None)
    for _ in range(8):
        probe.ping.emit()
    after = sys.getrefcount(True), sys.getrefcount(None)
    return after[0] < before[0] or after[1] < before[1]


def apply() -> bool:
    """Immortalise None/True/False if this PySide6 + Python pair needs it. Idempotent."""
    global applied
    if applied or sys.version_info >= (3, 12) or sys.implementation.name != "cpython":
        return applied
    import PySide6

    if not PySide6.__version__.startswith("6.12") and not _leaks():
        return False
    for obj in (None, True, False):
        ctypes.c_ssize_t.from_address(id(obj)).value += _BUMP
    applied = True
    return True


def self_test(emits: int = 20000) -> bool:
    """Emit enough signals to have crashed without the fix (used by the tests)."""
    from PySide6.QtCore import QObject, Signal

    class _Probe(QObject):
        ping = Signal()

    probe = _Probe()
    probe.ping.connect(lambda: None)
    for _ in range(emits):
        probe.ping.emit()
    return True
