"""uvicorn's HTTP/1.1 protocol with a deadline for a request's headers (slow-loris).

uvicorn closes an idle keep-alive connection, but a client that sends a request line and then
one header byte now and then keeps its connection (and a place under the connection limit)
forever. Here every connection must deliver a whole request head within `header_timeout_s` of
connecting, or of its previous response; otherwise it is closed. Slow bodies are the app's
business (it reads them under its own timeouts).
"""
from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol


def guarded_protocol(header_timeout_s: float) -> type[H11Protocol]:
    """An H11Protocol class whose connections get `header_timeout_s` for each request head."""

    class GuardedH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm_head_timer()

        def data_received(self, data: bytes) -> None:
            cycle = self.cycle
            super().data_received(data)
            if self.cycle is not cycle:  # a whole request head arrived
                self._cancel_head_timer()

        def on_response_complete(self) -> None:
            cycle = self.cycle
            super().on_response_complete()
            if self.cycle is cycle and not self.transport.is_closing():  # no pipelined request started
                self._arm_head_timer()

        def connection_lost(self, exc) -> None:
            self._cancel_head_timer()
            super().connection_lost(exc)

        def _arm_head_timer(self) -> None:
            self._cancel_head_timer()
            self._head_timer = self.loop.call_later(header_timeout_s, self._head_too_slow)

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_too_slow(self) -> None:
            self._head_timer = None
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                return  # a request is being served: its body and reply have their own limits
            self.logger.debug("closing a connection that sent no complete request head in %ss", header_timeout_s)
            self.transport.close()

    return GuardedH11Protocol
