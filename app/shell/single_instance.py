"""One Parley per user and data folder: a second launch brings the running window forward.

The first instance listens on a local socket (a Unix socket; a named pipe on Windows) whose
name is derived from the user and the resolved data folder. A later launch connects, sends one
JSON line ({"cmd": "activate", "env": {...}}) and exits before loading anything heavy.

A socket file left behind by a crash is found dead (nobody accepts the connection) and removed.
Two launches at the same moment cannot both become primary: only one `listen` can succeed, and
the loser then finds the winner listening. Where listening fails for any other reason the app
runs unguarded rather than not at all.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import logging
import os
import sys
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

log = logging.getLogger(__name__)

# Passed on to the running instance so the desktop lets it take focus (Wayland / X11 startup).
FORWARDED_ENV = ("XDG_ACTIVATION_TOKEN", "DESKTOP_STARTUP_ID")
MAX_MESSAGE = 64 * 1024
_SUN_PATH_MAX = 100  # sockaddr_un.sun_path holds 104-108 bytes depending on the OS


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no USER / LOGNAME and no passwd entry
        return str(os.getuid()) if hasattr(os, "getuid") else "user"


def server_name(data_dir: Path) -> str:
    """The socket name for this user and data folder.

    On Unix it lives in $XDG_RUNTIME_DIR (private to the user) when there is one and the path
    fits; otherwise Qt puts it in the temp folder (per user on macOS and Windows)."""
    digest = hashlib.sha256(f"{_user()}\n{Path(data_dir).expanduser().resolve()}".encode()).hexdigest()
    name = f"parley-{digest[:20]}"
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if sys.platform != "win32" and runtime and os.path.isdir(runtime):
        path = os.path.join(runtime, name + ".sock")
        if len(os.fsencode(path)) <= _SUN_PATH_MAX:
            return path
    return name


class SingleInstance(QObject):
    """`claim()` once at startup: True -> this is the running instance (it now listens and
    emits `activated(message)` for each later launch); False -> another one runs and was told."""

    activated = Signal(dict)

    def __init__(self, name: str, parent: QObject | None = None):
        super().__init__(parent)
        self.name = name
        self.server: QLocalServer | None = None
        self._buffers: dict[QLocalSocket, bytearray] = {}

    @classmethod
    def for_data_dir(cls, data_dir: Path, parent: QObject | None = None) -> SingleInstance:
        return cls(server_name(data_dir), parent)

    def claim(self, message: dict | None = None, timeout_ms: int = 1500) -> bool:
        msg = dict(message or {"cmd": "activate"})
        msg.setdefault("env", {k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)})
        if self._send(msg, timeout_ms):
            return False
        server = QLocalServer(self)
        server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        if not server.listen(self.name):
            # The name is taken but nobody answered just now: either a socket left by a crash,
            # or another launch that started listening a moment ago. Ask once more, then clear it.
            if self._send(msg, timeout_ms):
                return False
            QLocalServer.removeServer(self.name)
            if not server.listen(self.name):
                log.warning(
                    "single instance: cannot listen on %s (%s); running unguarded", self.name, server.errorString()
                )
                return True
        server.newConnection.connect(self._accept)
        self.server = server
        log.info("single instance: listening on %s", server.fullServerName())
        return True

    def close(self) -> None:
        for sock in list(self._buffers):
            self._drop(sock)
        if self.server is not None:
            self.server.close()  # removes the socket file on Unix
            self.server = None

    # ------------------------------------------------------------ the second launch

    def _send(self, message: dict, timeout_ms: int) -> bool:
        sock = QLocalSocket()
        sock.connectToServer(self.name)
        if not sock.waitForConnected(timeout_ms):
            return False
        sock.write(json.dumps(message).encode() + b"\n")
        ok = sock.waitForBytesWritten(timeout_ms) or sock.bytesToWrite() == 0
        sock.disconnectFromServer()
        if sock.state() != QLocalSocket.LocalSocketState.UnconnectedState:
            sock.waitForDisconnected(timeout_ms)
        if not ok:
            log.warning("single instance: the running Parley did not take the message")
        return True  # something is listening: it is the running instance either way

    # ------------------------------------------------------------ the running instance
    # Socket signals go to bound methods of self (not lambdas or partials): Qt then drops the
    # connections when this object dies, before its child sockets do, so a socket that says
    # "disconnected" while being destroyed never calls into a half-deleted object.

    def _accept(self) -> None:
        while self.server is not None and (sock := self.server.nextPendingConnection()) is not None:
            self._buffers[sock] = bytearray()
            sock.readyRead.connect(self._on_ready_read)
            sock.disconnected.connect(self._on_disconnected)
            self._read(sock)
            if sock.state() == QLocalSocket.LocalSocketState.UnconnectedState:
                self._finish(sock)  # it said its piece and left before we got here

    def _on_ready_read(self) -> None:
        self._read(self.sender())

    def _on_disconnected(self) -> None:
        self._finish(self.sender())

    def _read(self, sock) -> None:
        buf = self._buffers.get(sock)
        if buf is None:
            return
        buf += bytes(sock.readAll().data())
        while b"\n" in buf:
            line, _, rest = bytes(buf).partition(b"\n")
            buf[:] = rest
            self._handle(line)
        if len(buf) > MAX_MESSAGE:
            log.warning("single instance: dropping an oversized message")
            self._drop(sock)

    def _finish(self, sock) -> None:
        self._read(sock)
        self._drop(sock)

    def _drop(self, sock) -> None:
        if self._buffers.pop(sock, None) is None:
            return
        sock.readyRead.disconnect(self._on_ready_read)
        sock.disconnected.disconnect(self._on_disconnected)
        sock.abort()
        sock.deleteLater()

    def _handle(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            log.warning("single instance: ignoring a malformed message")
            return
        if isinstance(msg, dict) and msg.get("cmd") == "activate":
            self.activated.emit(msg)


def bring_to_front(window, message: dict | None = None) -> None:
    """Show `window` un-minimised and ask the desktop to focus it, with the second launch's
    activation token when it had one (Wayland will not hand focus over without it)."""
    for key, value in ((message or {}).get("env") or {}).items():
        if key in FORWARDED_ENV and isinstance(value, str) and value:
            os.environ[key] = value  # Qt reads these when the window asks for activation
    window.setWindowState((window.windowState() & ~Qt.WindowState.WindowMinimized) | Qt.WindowState.WindowActive)
    window.show()
    window.raise_()
    window.activateWindow()
