"""The API's listening socket: its connections send small writes at once (TCP_NODELAY), so a
plain reply's body does not wait for the client's delayed ACK of its headers (~45 ms a turn)."""

from __future__ import annotations

import asyncio
import socket

from engine.api.server import _bind


def test_connections_to_the_api_socket_have_nagle_off():
    sock = _bind("127.0.0.1", 0, 8)
    port = sock.getsockname()[1]
    seen: list[int] = []

    async def run() -> None:
        accepted = asyncio.Event()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport) -> None:
                s = transport.get_extra_info("socket")
                seen.append(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()
                accepted.set()

        server = await asyncio.get_running_loop().create_server(Probe, sock=sock)  # as uvicorn serves it
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            await asyncio.wait_for(accepted.wait(), 10)
            writer.close()
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(run())
    assert sock.proto == socket.IPPROTO_TCP and seen and seen[0] != 0
