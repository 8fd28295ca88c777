"""Stop sequences over streamed text: release only text that cannot turn into a stop."""

from __future__ import annotations


class StopScanner:
    """Feed decoded pieces with `push`; it returns the text that is safe to send. Text that may
    be the start of a stop sequence is held back until the next piece decides it. Once a stop
    sequence appears, `hit` is set and the reply is cut just before it."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.longest = max((len(s) for s in self.stops), default=0)
        self.text = ""
        self.sent = 0
        self.hit = False

    def push(self, piece: str) -> str:
        if self.hit or not piece:
            return ""
        if not self.stops:
            self.text += piece
            self.sent = len(self.text)
            return piece
        start = max(0, len(self.text) - self.longest + 1)
        self.text += piece
        found = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if found:
            self.hit = True
            self.text = self.text[: min(found)]
            return self._release(len(self.text))
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.text)), hold, -1):
                if self.text.endswith(s[:k]):
                    hold = k
                    break
        return self._release(len(self.text) - hold)

    def flush(self) -> str:
        """The turn ended without a stop: everything held back is reply text after all."""
        return self._release(len(self.text))

    def _release(self, end: int) -> str:
        end = max(end, self.sent)
        out = self.text[self.sent : end]
        self.sent = end
        return out
