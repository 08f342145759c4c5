"""Lark's long connection (events over a websocket, no public ingress) as a Service.

The SDK's client (``lark_oapi.ws.Client``) is blocking: ``start()`` runs its own event loop
until the process ends, reconnecting by itself, and calls the event handler synchronously on
that loop. So it runs on a thread of its own, with a loop of its own; each event is handed
to this process's loop (``run_coroutine_threadsafe``) and the handler waits for ingest, so
Lark hears "failed" (and redelivers) when an event could not be recorded.

The SDK keeps its loop in a module global (``lark_oapi.ws.client.loop``, captured at
import, possibly this process's running loop); it is replaced once by a proxy that resolves
to the calling thread's loop, so the client only ever touches its own thread's loop.

This is the one part of the channel that uses the SDK (``lark-oapi``, the ``lark`` extra):
the long connection's framing is the SDK's own protocol, which it implements and we do not.
The callbacks (:mod:`.callback`) and the Open API calls (:mod:`.client`) are plain HTTPS,
JSON and AES, done on what the control plane has anyway. So the SDK is imported here only,
when the long connection runs, and ``build_adapter`` refuses a long connection without it.

The SDK has no stop: the service stops the client's loop from outside (``loop.stop``), then
cancels what was left on it and closes the socket. If the client gives up (bad credentials,
too many connections) the thread ends and the service starts it again with backoff.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from controlplane.channels.lark.events import MESSAGE_EVENT
from controlplane.errors import InvalidInput, TransientError
from controlplane.services import Service, critical_loop
from controlplane.settings import LarkSettings

log = logging.getLogger(__name__)

# Lark expects an event's answer within 3 s; past that it redelivers (ingest dedupes).
HANDLE_TIMEOUT = 3.0
STOP_TIMEOUT = 5.0  # seconds to wait for the client's thread to end
RETRY_CAP = 60.0  # the longest wait between two attempts to connect

Handle = Callable[[dict[str, Any]], Coroutine[Any, Any, object]]


class _ThreadLoop:
    """Stands in for the SDK's global loop: every use goes to the calling thread's loop."""

    def __init__(self, replaced: object) -> None:
        # The loop the SDK captured may be in use elsewhere (it may be this process's): it
        # stays referenced, as the SDK kept it, rather than being closed or collected.
        self._replaced = replaced

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio.get_event_loop(), name)


_install_lock = threading.Lock()


def _install_thread_loop() -> None:
    import lark_oapi.ws.client as lark_ws

    with _install_lock:
        if not isinstance(lark_ws.loop, _ThreadLoop):
            lark_ws.loop = _ThreadLoop(lark_ws.loop)


class LongConnection(Service):
    name = "lark-long-connection"

    def __init__(self, settings: LarkSettings, handle: Handle) -> None:
        super().__init__()
        if settings.app_id is None or settings.app_secret is None:
            raise ValueError("the long connection needs app_id and app_secret")
        self._app_id = settings.app_id
        self._app_secret = settings.app_secret.get_secret_value()
        self._domain = settings.domain.rstrip("/")
        self._handle = handle
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._client_loop: asyncio.AbstractEventLoop | None = None

    async def run(self) -> None:
        _install_thread_loop()
        await critical_loop(self.name, self._connect_once, self.stopping, backoff_cap=RETRY_CAP)

    async def _connect_once(self) -> None:
        """Run the client on its thread until it ends or the service stops."""
        main = asyncio.get_running_loop()
        ended: asyncio.Future[BaseException | None] = main.create_future()
        self._halt.clear()
        thread = threading.Thread(
            target=self._client_thread, args=(main, ended), name=self.name, daemon=True
        )
        thread.start()
        stop = asyncio.ensure_future(self.stopping.wait())
        either: list[asyncio.Future[Any]] = [ended, stop]
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            await self._halt_thread(thread)
        if self.stopping.is_set():
            return
        error = ended.result() if ended.done() else None
        raise TransientError(f"the Lark long connection ended: {error or 'for no reason given'}")

    async def _halt_thread(self, thread: threading.Thread) -> None:
        # A stop can land while the client is between two of its run_until_complete calls
        # (it then logs a failed connect and goes on): stop its loop until the thread ends.
        deadline = time.monotonic() + STOP_TIMEOUT
        while thread.is_alive() and time.monotonic() < deadline:
            with self._lock:
                self._halt.set()
                loop = self._client_loop
            if loop is not None and not loop.is_closed():
                with contextlib.suppress(RuntimeError):  # closed meanwhile: it is ending
                    loop.call_soon_threadsafe(loop.stop)
            await asyncio.to_thread(thread.join, 0.1)
        if thread.is_alive():
            log.warning("%s: the client's thread did not end within %.0fs", self.name, STOP_TIMEOUT)

    def _client_thread(
        self, main: asyncio.AbstractEventLoop, ended: asyncio.Future[BaseException | None]
    ) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        error: BaseException | None = None
        client: Any = None
        try:
            import lark_oapi
            from lark_oapi.core.enum import LogLevel

            with self._lock:
                if self._halt.is_set():
                    return
                self._client_loop = loop
            handler = (
                lark_oapi.EventDispatcherHandler.builder("", "")
                .register_p2_customized_event(
                    MESSAGE_EVENT, lambda event: self._on_event(event, main)
                )
                .build()
            )
            # Built on this thread: the client schedules housekeeping on the current loop.
            client = lark_oapi.ws.Client(
                self._app_id,
                self._app_secret,
                event_handler=handler,
                domain=self._domain,
                # INFO would log the connection URL, which carries an access ticket.
                log_level=LogLevel.WARNING,
            )
            client.start()  # returns only when it gives up, or when its loop is stopped
        except Exception as exc:
            if not self._halt.is_set():
                error = exc
        finally:
            _wind_down(loop, client)
            with self._lock:
                self._client_loop = None
            with contextlib.suppress(RuntimeError):  # the process's loop is closed: gone
                main.call_soon_threadsafe(_settle, ended, error)

    def _on_event(self, event: Any, main: asyncio.AbstractEventLoop) -> None:
        """Called by the SDK on the client's thread; raising makes Lark redeliver."""
        import lark_oapi

        payload = json.loads(lark_oapi.JSON.marshal(event))
        future: concurrent.futures.Future[object] = asyncio.run_coroutine_threadsafe(
            self._handle(payload), main
        )
        try:
            future.result(timeout=HANDLE_TIMEOUT)
        except InvalidInput as exc:  # redelivering it would not make it well-formed
            log.warning("%s: dropped a malformed event: %s", self.name, exc)
        except concurrent.futures.TimeoutError:
            log.warning("%s: an event took over %.0fs to record", self.name, HANDLE_TIMEOUT)
            raise


def _settle(ended: asyncio.Future[BaseException | None], error: BaseException | None) -> None:
    if not ended.done():
        ended.set_result(error)


def _wind_down(loop: asyncio.AbstractEventLoop, client: Any) -> None:
    """Cancel what the client left on its loop, close its socket, close the loop."""
    try:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        # The SDK offers no way to close its connection but its own attribute.
        conn = getattr(client, "_conn", None)
        if conn is not None:
            loop.run_until_complete(asyncio.wait_for(conn.close(), timeout=2.0))
        loop.run_until_complete(loop.shutdown_asyncgens())
    except Exception:
        log.debug("lark long connection: error while winding down", exc_info=True)
    finally:
        loop.close()
