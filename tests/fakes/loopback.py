"""Serving a fake's ASGI app over real HTTP on loopback (owned by the test suite).

* ``LoopbackServer`` binds ``127.0.0.1`` on an ephemeral port and runs a ``uvicorn.Server``
  for an ASGI app in a daemon thread with its own event loop, so sync and async tests alike
  reach it with real clients. It knows its ``port`` and ``url``, and its ``loop`` for
  scheduling coroutines on the server (a websocket send, say) from the test's thread.
* ``Lifecycle`` gives anything with ``start()`` / ``stop()`` the context-manager protocol;
  ``LoopbackFake`` is a ``Lifecycle`` whose start and stop are its ``LoopbackServer``'s
  (``self._http``).
"""

from __future__ import annotations

import abc
import asyncio
import socket
import threading
import time
from types import TracebackType
from typing import Self

import uvicorn
from starlette.types import ASGIApp

__all__ = ["Lifecycle", "LoopbackFake", "LoopbackServer"]


class LoopbackServer:
    """``app`` over HTTP (HTTPS with ``tls``; and websockets, with ``websockets=True``) on
    ``host``.

    ``name`` is what error messages and the server thread are called. Restartable: a new
    ``start()`` after ``stop()`` serves on a new port.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        name: str,
        host: str = "127.0.0.1",
        websockets: bool = False,
        graceful_shutdown: int = 2,
        tls: tuple[str, str] | None = None,
    ) -> None:
        self.app = app
        self.tls = tls  # (certificate file, key file): HTTPS instead of HTTP
        self.name = name
        self.host = host
        self.websockets = websockets
        self.graceful_shutdown = graceful_shutdown
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._port: int | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"{self.name} is not started")
        return self._port

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The server thread's event loop (for ``asyncio.run_coroutine_threadsafe``)."""
        if self._loop is None or not self.running:
            raise RuntimeError(f"{self.name} is not running")
        return self._loop

    def start(self, timeout: float = 10.0) -> None:
        """Serve, returning once uvicorn has started (``RuntimeError`` if it does not)."""
        if self._thread is not None:
            raise RuntimeError(f"{self.name} already started")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self._socket = sock
        self._port = port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            self.app,
            host=self.host,
            port=port,
            loop="asyncio",
            http="h11",
            ws="websockets-sansio" if self.websockets else "none",
            lifespan="off",
            log_config=None,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=self.graceful_shutdown,
            ssl_certfile=self.tls[0] if self.tls else None,
            ssl_keyfile=self.tls[1] if self.tls else None,
        )
        server = uvicorn.Server(config)
        self._server = server
        thread = threading.Thread(
            target=self._serve, args=(server, sock), name=f"{self.name}-{port}", daemon=True
        )
        self._thread = thread
        thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not thread.is_alive():
                self.stop()
                raise RuntimeError(f"{self.name} exited during startup")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not start within {timeout}s")
            time.sleep(0.005)

    def _serve(self, server: uvicorn.Server, sock: socket.socket) -> None:
        # What ``server.run`` does, keeping hold of the loop.
        with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
            self._loop = runner.get_loop()
            runner.run(server.serve(sockets=[sock]))

    def stop(self, timeout: float = 10.0) -> None:
        """Shut down (forcibly if a graceful exit takes over ``timeout``); idempotent."""
        server, thread = self._server, self._thread
        if server is not None and thread is not None:
            server.should_exit = True
            thread.join(timeout)
            if thread.is_alive():
                server.force_exit = True
                thread.join(timeout)
        if self._socket is not None:
            self._socket.close()
        self._socket = self._server = self._thread = self._loop = None


class Lifecycle(abc.ABC):
    """``with fake:`` starts it and stops it on the way out."""

    @abc.abstractmethod
    def start(self) -> Self: ...

    @abc.abstractmethod
    def stop(self) -> None: ...

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class LoopbackFake(Lifecycle):
    """A fake served by ``self._http`` (set it in ``__init__``)."""

    _http: LoopbackServer

    def start(self, timeout: float = 10.0) -> Self:
        self._http.start(timeout)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._http.stop(timeout)
