"""A loopback TCP load balancer: each connection goes to a random target that accepts it.

It stands in for the load balancer in front of a deployment's replicas: a device dials one
address, and when the replica behind its connection dies, its next connection lands on one
that is alive. Bytes pass untouched (TLS included).
"""

from __future__ import annotations

import asyncio
import contextlib
import random


class Balancer:
    def __init__(self, targets: list[int], host: str = "127.0.0.1") -> None:
        self.targets = targets
        self.host = host
        self.port = 0
        self.connections: dict[int, int] = {}  # target port -> connections made
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> Balancer:
        self._server = await asyncio.start_server(self._handle, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for port in random.sample(self.targets, len(self.targets)):
            try:
                up_reader, up_writer = await asyncio.open_connection(self.host, port)
            except OSError:
                continue
            self.connections[port] = self.connections.get(port, 0) + 1
            await asyncio.gather(
                self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True
            )
            return
        writer.close()

    @staticmethod
    async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        finally:
            with contextlib.suppress(Exception):
                dst.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
