"""Text from outside made safe to show: control characters escaped before a terminal, and a
URL's user:password@ never shown.

A reply or an error message from a server could hold escape sequences that retitle the terminal,
clear the screen or write the clipboard (OSC 52); printed as-is they act. Each control character
except newline and tab is shown as a visible \\xNN escape instead (a lone carriage return too: it
could overwrite the line); nothing is dropped, so a person still sees that something was there.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # C0 but \t and \n, DEL, C1 (0x9b starts CSI)


def terminal_safe(text: object) -> str:
    return _UNSAFE.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text).replace("\r\n", "\n"))


def hide_credentials(url: str) -> str:
    """`http://user:secret@host:8000/v1` -> `http://host:8000/v1` (for messages and logs)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
