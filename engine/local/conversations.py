"""The engine's hot conversations: lookup, which ones to free first, and which session a
stateless client (the API) continues."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..protocol.events import STATELESS_PREFIX

if TYPE_CHECKING:
    from .session import Session

MAX_STATELESS_SESSIONS = 8


class Conversations(dict):
    """conversation id -> Session (a dict, so reports and the spill_scheduler iterate it directly)."""

    def __init__(self):
        super().__init__()
        self._stateless_seq = 0

    def open(self, conversation_id: str) -> Session:
        session = self.get(conversation_id)
        if session is None:
            from .session import Session  # torch (via prompt): an Engine is made before torch loads

            session = self[conversation_id] = Session(conversation_id)
        return session

    def idle_hot(self, active: str | None) -> list[Session]:
        """Conversations holding KV, least recently used first, never the active one."""
        return sorted((s for c, s in self.items() if c != active and s.cache is not None), key=lambda s: s.last_used)

    def kv_bytes(self) -> int:
        return sum(s.kv_bytes() for s in self.values())

    def match_stateless(self, prompt) -> tuple[str, list[Session]]:
        """The stateless session sharing the longest prefix with `prompt` (clients re-send the
        whole conversation each request), or a new one; beyond the limit the least recently
        used are retired: returned for the caller to release, and forgotten here. Window
        conversations are never borrowed: cropping them would throw away their own reuse."""
        best, best_len = None, 0
        stateless = [s for c, s in self.items() if c.startswith(STATELESS_PREFIX)]
        for s in stateless:
            n = s.reusable_prefix(prompt)
            # a shared template opening is no reason to crop another client's conversation;
            # continuing it (or an edit near its end) is
            if n > best_len and n * 2 >= s.cached_tokens:
                best, best_len = s.conversation_id, n
        if best is not None:
            return best, []
        stateless.sort(key=lambda s: s.last_used)
        retired = stateless[: max(0, len(stateless) - MAX_STATELESS_SESSIONS + 1)]
        for s in retired:
            self.pop(s.conversation_id, None)
        self._stateless_seq += 1
        return f"{STATELESS_PREFIX}{self._stateless_seq}", retired
