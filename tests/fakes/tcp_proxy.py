"""A loopback TCP proxy that can cut every connection through it, on demand or on a timer.

It stands in for the flaky networks and proxies between a laptop and the cloud: bytes pass
untouched (TLS included); ``drop_all()`` resets every open connection at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.drops = 0
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._dropper: asyncio.Task[None] | None = None

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self.connections += 1
        pair = (writer, up_writer)
        self._pairs.add(pair)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(Exception):
                dst.close()

        try:
            await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        finally:
            self._pairs.discard(pair)

    def drop_all(self) -> None:
        """Reset every connection (RST, like a NAT box forgetting them)."""
        for client, upstream in list(self._pairs):
            for writer in (client, upstream):
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                        )
                writer.transport.abort()
        self._pairs.clear()
        self.drops += 1

    def drop_every(self, seconds: float) -> None:
        async def loop() -> None:
            while True:
                await asyncio.sleep(seconds)
                self.drop_all()

        self._dropper = asyncio.get_running_loop().create_task(loop())

    async def stop(self) -> None:
        if self._dropper is not None:
            self._dropper.cancel()
        self.drop_all()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
