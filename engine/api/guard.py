"""uvicorn's HTTP/1.1 protocol with a deadline for a request's headers (slow-loris), and idle
connections that never stand in a request's way.

uvicorn closes an idle keep-alive connection, but a client that sends a request line and then
one header byte now and then keeps its connection forever. Here every connection must deliver a
whole request head within `header_timeout_s` of connecting, or of its previous response;
otherwise it is closed. Slow bodies are the app's business (it reads them under its own timeouts).

uvicorn's only cap, `limit_concurrency`, counts open connections together with requests, so 512
connections that never send a byte made every request (an authorised one too) a 503 until they
went. It is not used: requests are capped by the app (429 with Retry-After, only to requests
that arrived), and connections still waiting for a head are what is capped here: past
`max_waiting` of them the one waiting longest is closed, so a thousand idle sockets cost only
their file descriptors and never hold a new client's connection out.

It also offers the app `scope["extensions"]["parley.discard_body"]["discard"](limit)`: after refusing a big
body, the rest of it is dropped as it arrives, without HTTP parsing or copies into the app,
so that a client still sending gets the answer (not a reset) at little cost to everyone else:
it is read at most DROP_BYTES_PER_S, so a client re-sending huge bodies cannot take the
machine's memory bandwidth from the requests being served.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from h11._readers import ContentLengthReader  # h11 is pinned by uvicorn; only read, never changed
from uvicorn.protocols.http.h11_impl import H11Protocol

DROP_BYTES_PER_S = 64 << 20  # 30 MB refused in about 0.5 s


def guarded_protocol(header_timeout_s: float, max_waiting: int = 4096) -> type[H11Protocol]:
    """An H11Protocol class whose connections get `header_timeout_s` for each request head, and
    of which at most `max_waiting` wait for one (the longest waiting is closed past that)."""
    # connections waiting for a request head, oldest first (event-loop thread only)
    waiting: OrderedDict[GuardedH11Protocol, None] = OrderedDict()

    class GuardedH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None
        _discard_left: int | None = None  # body bytes still to drop unparsed
        _discard_done: asyncio.Future | None = None
        _discard_start = 0.0
        _discarded = 0

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm_head_timer()

        def data_received(self, data: bytes) -> None:
            if self._discard_left is not None:
                self._discard_left -= len(data)
                self._discarded += len(data)
                if self._discard_left <= 0:
                    self._end_discard()
                    return
                ahead = self._discarded / DROP_BYTES_PER_S - (self.loop.time() - self._discard_start)
                if ahead > 0.005:  # faster than the drop rate: wait before reading more
                    self.flow.pause_reading()
                    self.loop.call_later(ahead, self.flow.resume_reading)
                return
            cycle = self.cycle
            super().data_received(data)
            if self.cycle is not cycle:  # a whole request head arrived
                self._cancel_head_timer()
                waiting.pop(self, None)
                # an ASGI extension's value is a dict of what it offers
                self.scope.setdefault("extensions", {})["parley.discard_body"] = {"discard": self._discard_body}

        def _discard_body(self, limit: int) -> asyncio.Future | None:
            """Drop the rest of the request body (a Content-Length one, at most `limit` bytes more)
            as it arrives; the future is done once it all has. None: not possible here (the app
            reads and drops it itself)."""
            reader = self.conn._reader  # h11's private reader state (see the import above)
            if not isinstance(reader, ContentLengthReader):
                return None
            left = reader._remaining - len(self.conn._receive_buffer)  # not yet read from the socket
            if left > limit:
                return None
            self._discard_done = self.loop.create_future()
            self._discard_left = left
            self._discard_start, self._discarded = self.loop.time(), 0
            if left <= 0:
                self._end_discard()
            self.flow.resume_reading()
            return self._discard_done

        def _end_discard(self) -> None:
            self._discard_left = None
            if self._discard_done is not None and not self._discard_done.done():
                self._discard_done.set_result(None)

        def on_response_complete(self) -> None:
            cycle = self.cycle
            super().on_response_complete()
            if self.cycle is cycle and not self.transport.is_closing():  # no pipelined request started
                self._arm_head_timer()

        def connection_lost(self, exc) -> None:
            self._cancel_head_timer()
            waiting.pop(self, None)
            self._end_discard()
            super().connection_lost(exc)

        def _arm_head_timer(self) -> None:
            self._cancel_head_timer()
            self._head_timer = self.loop.call_later(header_timeout_s, self._head_too_slow)
            waiting[self] = None
            waiting.move_to_end(self)
            while len(waiting) > max_waiting:
                oldest, _ = waiting.popitem(last=False)
                oldest._cancel_head_timer()
                oldest.transport.close()

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_too_slow(self) -> None:
            self._head_timer = None
            waiting.pop(self, None)
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                return  # a request is being served: its body and reply have their own limits
            self.logger.debug("closing a connection that sent no complete request head in %ss", header_timeout_s)
            self.transport.close()

    return GuardedH11Protocol
