"""The socket `towerboard serve` listens on gives every connection TCP_NODELAY, as uvicorn's
own sockets do: without it, a keep-alive connection (every browser's, and the CLI's) waited
about 40 ms on each answer, Nagle's algorithm holding the body until the client's delayed
acknowledgement of the headers."""

from __future__ import annotations

import asyncio
import socket
from concurrent.futures import ThreadPoolExecutor

from service.cli import _listen


def test_served_connections_have_nodelay() -> None:
    listening = _listen("127.0.0.1", 0)

    async def accepted_nodelay() -> int:
        loop = asyncio.get_running_loop()
        nodelay: asyncio.Future[int] = loop.create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                nodelay.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        # As uvicorn serves the sockets `towerboard serve` hands it.
        server = await loop.create_server(Probe, sock=listening)
        host, port = listening.getsockname()[:2]
        _, writer = await asyncio.open_connection(host, port)
        try:
            return await asyncio.wait_for(nodelay, 10)
        finally:
            writer.close()
            server.close()
            await server.wait_closed()

    # On a thread of its own: the session's sync Playwright (tests/conftest.py) keeps an
    # event loop running on the main thread once a dashboard test has started it.
    with ThreadPoolExecutor(1) as thread:
        assert thread.submit(asyncio.run, accepted_nodelay()).result() != 0
