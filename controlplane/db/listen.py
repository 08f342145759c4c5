"""One LISTEN connection, kept up, with its poll fallback: :func:`listen`.

Whatever wakes on a Postgres notification (the effect runner, the router, the workers, the
device and chat hubs, command waiters) holds one :class:`Listener`::

    async with listen(dsn, Notify.ROUTER, name="router") as listener:
        while not stopping.is_set():
            do_work()
            await listener.wait(POLL_SECONDS, unless=stopping)

It holds ONE connection LISTENing on its channels (its own ``asyncpg.connect``, or one held
from a pool), sets :attr:`Listener.wake` on every notification and hands each payload to its
channel's callback. When the connection dies (asyncpg's termination listener, with a look
at ``is_closed()`` every few seconds underneath) it is replaced in the background, with
backoff, and a database outage is reported once for the episode (``outage.absorbed``), not
per retry. Notifications sent while nothing listens are lost, not queued: after every
(re)connect the wake is set and ``on_connect`` called, so the waiter looks at the state
again. :meth:`Listener.wait` is the poll: it returns when woken or after the interval, so
a lost notification costs at most one interval.

It must not: raise from its background machinery (a callback's error is logged), or hold
up a shutdown (closing cancels the reconnecting and gives the connection a bounded time).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from controlplane.db import outage
from controlplane.db.pool import Conn
from superagent_shared import backoff

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0
CLOSE_TIMEOUT = 2.0
# Under the termination listener: how often the connection is looked at anyway.
CHECK_SECONDS = 5.0

Callback = Callable[[], None]


class Listener:
    """One LISTEN connection on ``channels``; made by :func:`listen`, see the module."""

    def __init__(
        self,
        source: str | asyncpg.Pool,
        channels: tuple[str, ...],
        *,
        on_notify: Mapping[str, Callable[[str], None]] | None = None,
        on_connect: Callback | None = None,
        on_lost: Callback | None = None,
        name: str,
    ) -> None:
        self.name = name
        # Set by every notification on any channel, and after every (re)connect.
        self.wake = asyncio.Event()
        self._source = source
        self._callbacks = dict(on_notify or {})
        self.channels = tuple(dict.fromkeys([*channels, *self._callbacks]))
        self._on_connect = on_connect
        self._on_lost = on_lost
        self._conn: Conn | None = None
        self._task: asyncio.Task[None] | None = None
        self._starting = False
        self._lost = asyncio.Event()
        self._closed = asyncio.Event()
        self._backoff = backoff.Backoff(initial=0.5, factor=2.0, cap=30.0)
        self._warned = False  # a failure to listen was logged, and no success since

    @property
    def connection(self) -> Conn | None:
        """The connection listening now, if any."""
        return self._conn if self.listening else None

    @property
    def listening(self) -> bool:
        """Whether notifications reach this listener now."""
        conn = self._conn
        if conn is None:
            return False
        try:
            return not conn.is_closed()
        except asyncpg.InterfaceError:  # a pool's connection, taken back when it died
            return False

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> Listener:
        """Listen (a first attempt now), and keep listening until :meth:`close`. Never
        raises: while it cannot listen, :meth:`wait` is a plain poll."""
        if self._task is None and not self._starting:
            self._starting = True
            try:
                self._closed.clear()
                await self._connect()
                if not self._closed.is_set():  # else closed meanwhile
                    self._task = asyncio.create_task(self._keep(), name=f"listen:{self.name}")
            finally:
                self._starting = False
        return self

    async def close(self) -> None:
        """Stop listening: the reconnecting ends, the connection is closed (or given back to
        its pool) within CLOSE_TIMEOUT. Idempotent."""
        self._closed.set()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._discard(conn)

    async def __aenter__(self) -> Listener:
        return await self.start()

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # -- waiting -------------------------------------------------------------------------

    async def wait(self, timeout: float, *, unless: asyncio.Event | None = None) -> bool:
        """Until woken (a notification or a reconnect), ``timeout`` seconds at most (the
        poll), or until ``unless`` is set. True if woken; the wake is consumed either way."""
        if not self.wake.is_set() and not (unless is not None and unless.is_set()):
            waits = [asyncio.ensure_future(self.wake.wait())]
            if unless is not None:
                waits.append(asyncio.ensure_future(unless.wait()))
            try:
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waits:
                    waiter.cancel()
        woken = self.wake.is_set()
        self.wake.clear()
        return woken

    # -- the connection ------------------------------------------------------------------

    async def _keep(self) -> None:
        """Replace the connection whenever it is gone, until closed."""
        while not self._closed.is_set():
            if isinstance(self._source, asyncpg.Pool) and self._source.is_closing():
                return  # nothing to listen from any more; close() ends the rest
            conn = self._conn
            if conn is None:
                if not await self._connect():
                    await outage.wait_back(self._closed, self._backoff.next_delay())
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lost.wait(), CHECK_SECONDS)
            if self._conn is conn and not self.listening:  # closed without telling
                self._gone(conn)

    async def _connect(self) -> bool:
        """One attempt to listen; True if listening now. Never raises but to a cancel."""
        try:
            conn = await self._open()
        except Exception as exc:
            await self._failed(exc)
            return False
        try:
            conn.add_termination_listener(self._gone)
            for channel in self.channels:
                await conn.add_listener(channel, self._dispatch)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                conn.terminate()  # half set up: nobody's to use (a pool's is given back)
            if not isinstance(exc, Exception):
                raise
            await self._failed(exc)
            return False
        if self._closed.is_set():  # closed while connecting
            await self._discard(conn)
            return False
        self._conn = conn
        self._lost.clear()
        self._backoff.reset()
        if self._warned:
            self._warned = False
            log.info("%s: listening again", self.name)
        self._call(self._on_connect)
        self.wake.set()
        return True

    async def _open(self) -> Conn:
        if isinstance(self._source, asyncpg.Pool):
            return await self._source.acquire(timeout=CONNECT_TIMEOUT)
        return await asyncpg.connect(self._source, timeout=CONNECT_TIMEOUT)

    async def _failed(self, exc: Exception) -> None:
        """Reported once: an outage as the process's episode, anything else as a warning."""
        if await outage.absorbed(exc, self.name) or self._warned:
            log.debug("%s: no LISTEN connection (%s)", self.name, exc)
            return
        self._warned = True
        log.warning(
            "%s: no LISTEN connection (%s: %s); polling until it is back",
            self.name,
            type(exc).__name__,
            exc,
            exc_info=None if isinstance(exc, outage.DATABASE_ERRORS) else exc,
        )

    def _gone(self, conn: object) -> None:
        """The connection died (its termination listener, or found closed)."""
        if conn is not self._conn or conn is None:
            return  # an older one, or one closed on purpose
        self._conn = None
        self._lost.set()
        log.debug("%s: LISTEN connection lost; reconnecting", self.name)
        self._call(self._on_lost)

    async def _discard(self, conn: Conn) -> None:
        """Close a connection, or give it back to its pool, never raising or hanging."""
        try:
            conn.remove_termination_listener(self._gone)
            if isinstance(conn, PoolConnectionProxy) and isinstance(self._source, asyncpg.Pool):
                # The pool's release keeps the session (no reset query): UNLISTEN first.
                async with asyncio.timeout(CLOSE_TIMEOUT):
                    for channel in self.channels:
                        await conn.remove_listener(channel, self._dispatch)
                await self._source.release(conn, timeout=CLOSE_TIMEOUT)
            else:
                await conn.close(timeout=CLOSE_TIMEOUT)
        except Exception:  # aborted instead, which cannot fail
            with contextlib.suppress(Exception):
                conn.terminate()

    def _dispatch(self, _conn: object, _pid: int, channel: str, payload: object) -> None:
        self.wake.set()
        callback = self._callbacks.get(channel)
        if callback is not None:
            try:
                callback(str(payload))
            except Exception:
                log.exception("%s: handling a %s notification failed", self.name, channel)

    def _call(self, callback: Callback | None) -> None:
        if callback is not None:
            try:
                callback()
            except Exception:
                log.exception("%s: a LISTEN connection callback failed", self.name)


def listen(
    source: str | asyncpg.Pool,
    *channels: str,
    on_notify: Mapping[str, Callable[[str], None]] | None = None,
    on_connect: Callback | None = None,
    on_lost: Callback | None = None,
    name: str,
) -> Listener:
    """A :class:`Listener` on ``channels`` and on the channels of ``on_notify`` (each
    called with its notifications' payloads), from ``source``: a DSN for a connection of
    its own, or a pool to hold one from. Not yet started: ``async with`` it, or call
    :meth:`Listener.start` and later :meth:`Listener.close`. ``on_connect`` runs after every
    (re)connect, ``on_lost`` when the connection dies (``name`` says whose, in the log)."""
    return Listener(
        source,
        channels,
        on_notify=on_notify,
        on_connect=on_connect,
        on_lost=on_lost,
        name=name,
    )
