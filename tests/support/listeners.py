"""A server outside the sandbox that greets every connection and counts who got through:
TCP on one address, or a Unix socket at a path (an agent's, a container engine's)."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
from pathlib import Path

GREETING = b"hello from outside\n"


class Greeter:
    """Listens on ``sock`` (bound already), greets each connection, counts them in
    :attr:`hits`."""

    def __init__(self, sock: socket.socket, path: Path | None = None) -> None:
        self.sock = sock
        self.path = path
        self.sock.listen()
        self.hits = 0
        threading.Thread(target=self._serve, daemon=True).start()

    @classmethod
    def tcp(
        cls, host: str = "127.0.0.1", port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> Greeter:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((host, port))
            return cls(sock)
        except BaseException:
            sock.close()
            raise

    @classmethod
    def unix(cls, path: Path) -> Greeter:
        """At ``path``, however long: bound at a short path and moved into place (a socket
        path is at most 108 bytes)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        short = Path(tempfile.mkdtemp(prefix="s-", dir="/tmp"))
        try:
            sock.bind(str(short / "s"))
            os.rename(short / "s", path)
        except BaseException:
            sock.close()
            raise
        finally:
            short.rmdir()
        return cls(sock, path)

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.hits += 1
            with conn:
                conn.sendall(GREETING)

    def close(self) -> None:
        self.sock.close()
