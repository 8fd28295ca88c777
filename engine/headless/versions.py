"""A replayed conversation with versions (#41): an edit adds a version of a user message, and the
turns after it stay with the version they followed, as in the window's history.

A tree: each level holds the versions of one user message (each with its reply and the level of
the next user message) and which one is shown; the conversation sent is the shown path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..protocol.events import Message


class VersionError(ValueError):
    """A script named a user message or a version the conversation does not have."""


@dataclass(eq=False)  # levels and nodes are told apart by identity, never by content
class _Node:
    user: Message
    reply: Message | None = None
    next: _Level = field(default_factory=lambda: _Level())


@dataclass(eq=False)
class _Level:
    """The versions of one user message and which of them is shown."""

    nodes: list[_Node] = field(default_factory=list)
    shown: int = 0


@dataclass(frozen=True)
class _Pending:
    """The node a turn in flight added, and the version shown before it (put back if it fails)."""

    level: _Level
    shown_before: int


@dataclass(frozen=True)
class VersionNumber:
    message: int  # the user message, 0-based
    version: int  # its version, 1-based
    of: int  # how many versions it has


class VersionedChat:
    def __init__(self) -> None:
        self._root = _Level()
        self._pending: _Pending | None = None

    def _levels(self) -> list[_Level]:
        """The levels of the shown path: one per user message shown, the first message's first."""
        out, level = [], self._root
        while level.nodes:
            out.append(level)
            level = level.nodes[level.shown].next
        return out

    def _end(self) -> _Level:
        levels = self._levels()
        return levels[-1].nodes[levels[-1].shown].next if levels else self._root

    def history(self) -> list[Message]:
        """The conversation as shown: each shown user message and its reply."""
        out: list[Message] = []
        for level in self._levels():
            node = level.nodes[level.shown]
            out.append(node.user)
            if node.reply is not None:
                out.append(node.reply)
        return out

    def _level(self, k: int) -> _Level:
        levels = self._levels()
        if not 0 <= k < len(levels):
            raise VersionError(f"the conversation has {len(levels)} user messages, no message {k} (0-based)")
        return levels[k]

    def send(self, user: Message) -> VersionNumber:
        """A new user message after the shown ones."""
        return self._add(self._end(), user)

    def edit(self, k: int, user: Message) -> VersionNumber:
        """`user` replaces the k-th user message (0-based) as its new version, shown from now on."""
        return self._add(self._level(k), user)

    def switch(self, k: int, version: int) -> None:
        """Show version `version` (1-based) of the k-th user message, with the turns that followed it there."""
        level = self._level(k)
        if not 1 <= version <= len(level.nodes):
            raise VersionError(f"user message {k} has {len(level.nodes)} versions, no version {version}")
        level.shown = version - 1

    def answered(self, reply: Message) -> None:
        """The turn in flight got its reply."""
        if self._pending is None:
            raise RuntimeError("no turn in flight")
        level = self._pending.level
        level.nodes[level.shown].reply = reply
        self._pending = None

    def failed(self) -> None:
        """The turn in flight failed: its message goes, and the version shown before is shown again."""
        if self._pending is None:
            raise RuntimeError("no turn in flight")
        level = self._pending.level
        level.nodes.pop()
        level.shown = self._pending.shown_before
        self._pending = None

    def _add(self, level: _Level, user: Message) -> VersionNumber:
        if self._pending is not None:
            raise RuntimeError("a turn is in flight")
        self._pending = _Pending(level, level.shown)
        level.nodes.append(_Node(user))
        level.shown = len(level.nodes) - 1
        k = next(i for i, shown in enumerate(self._levels()) if shown is level)
        return VersionNumber(k, len(level.nodes), len(level.nodes))
