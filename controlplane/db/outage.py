"""A database outage as one episode: one line when Postgres becomes unreachable, one when it
is back, and every loop resuming within a second of its return.

Without this, a Postgres restart showed as a warning per loop per retry and a traceback per
pool connection. Here the loops (:func:`controlplane.services.critical_loop`, the
leadership and heartbeat loops, the HTTP error handler) hand their connection errors to
:func:`absorbed`. The first one opens the episode; :class:`DatabaseWatch`, a Service of
every replica (in ``services.py``), then probes Postgres once a second and, when it
answers, logs the end of the episode and wakes every loop waiting out a backoff
(:func:`wait_back`).

A replica keeps serving (/healthz answers, /readyz says not ready) and retrying through an
outage of any length, unless ``SUPERAGENT_DATABASE_OUTAGE_EXIT_SECONDS`` is set: then it
exits once the outage has lasted that long, for a supervisor that would rather restart it.

It must not: decide anything about an error it cannot confirm. An error counts as an
outage only while a probe of the database fails too, so a Slack socket's ``OSError`` is
not mistaken for one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import asyncpg

from controlplane.errors import SuperagentError

log = logging.getLogger(__name__)

_PROBE_TIMEOUT = 3.0
_PROBE_EVERY = 1.0

# What a connection that cannot be made, or was cut, raises (asyncpg, the only driver
# runtime code queries through).
CONNECTION_ERRORS: tuple[type[Exception], ...] = (
    OSError,  # refused, no such socket file, reset; TimeoutError too
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,  # the connection was closed under us
    asyncpg.exceptions.CannotConnectNowError,  # starting up, shutting down
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    # A pool connection left mid-operation when the server went away (asyncpg's own
    # "another operation is in progress"): the pools are renewed when the outage ends.
    asyncpg.exceptions.InternalClientError,
)


# Anything a database call can raise that is the database's answer or its absence (and not
# a bug in the caller): what a loop catches around a statement. Narrower tuples missed the
# asyncpg errors that are not PostgresError (InterfaceError, InternalClientError), which a
# restart raises, and a loop then called its own outage "a bug".
DATABASE_ERRORS: tuple[type[Exception], ...] = (asyncpg.PostgresError, *CONNECTION_ERRORS)


class DatabaseGoneError(SuperagentError):
    """The database stayed unreachable past ``SUPERAGENT_DATABASE_OUTAGE_EXIT_SECONDS``."""

    code = "database_gone"


def is_connection_error(exc: BaseException) -> bool:
    return isinstance(exc, CONNECTION_ERRORS)


# Errors of a reachable database that are its state, not the statement's: retried later.
_DATABASE_TROUBLE: tuple[type[Exception], ...] = (
    asyncpg.exceptions.TransactionRollbackError,  # serialization failure, deadlock
    asyncpg.exceptions.InsufficientResourcesError,  # disk full, too many connections
    asyncpg.exceptions.OperatorInterventionError,  # shutdown, cancelled by an admin
    asyncpg.exceptions.LockNotAvailableError,
)


def database_trouble(exc: BaseException) -> bool:
    """The database's trouble, not the item's: an outage, a deadlock, a full disk. A loop
    that handles items leaves such an item as it was (to be tried once the database is
    well) instead of counting it as the item's failure."""
    return is_connection_error(exc) or isinstance(exc, _DATABASE_TROUBLE)


class _Episode:
    """The process's view of its database: reachable, or down since when."""

    def __init__(self) -> None:
        self.dsn: str | None = None
        self.down_since: float | None = None
        self.errors = 0
        self._back: asyncio.Event | None = None
        self._probing: asyncio.Lock | None = None

    @property
    def back(self) -> asyncio.Event:
        if self._back is None:
            self._back = asyncio.Event()
            self._back.set()
        return self._back

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]


_episode = _Episode()
# The process's pools: their connections all predate an outage's end, and are replaced then.
# (A list: asyncpg pools cannot be weakly referenced; closed ones are dropped as seen.)
_pools: list[asyncpg.Pool] = []


def track(pool: asyncpg.Pool) -> None:
    _pools[:] = [p for p in _pools if not p.is_closing()]
    _pools.append(pool)


def configure(dsn: str | None) -> None:
    """Where to probe; ``None`` (the default) leaves errors to their loops' own logging."""
    _episode.reset()
    _episode.dsn = dsn


def down() -> bool:
    return _episode.down_since is not None


async def probe() -> bool:
    """Whether the database answers a trivial query now."""
    if _episode.dsn is None:
        return True
    try:
        conn = await asyncpg.connect(_episode.dsn, timeout=_PROBE_TIMEOUT)
    except Exception:  # any failure to connect is "not now"
        return False
    try:
        await asyncio.wait_for(conn.fetchval("SELECT 1"), _PROBE_TIMEOUT)
        return True
    except Exception:
        return False
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.close(), _PROBE_TIMEOUT)


async def absorbed(exc: BaseException, where: str) -> bool:
    """True if ``exc`` is part of a database outage (now logged as the episode's start, once);
    the caller then logs it at most at debug level. False: the caller's own error."""
    if _episode.dsn is None or not is_connection_error(exc):
        return False
    if _episode.down_since is not None:
        _episode.errors += 1
        return True
    if _episode._probing is None:
        _episode._probing = asyncio.Lock()
    async with _episode._probing:
        if _episode.down_since is None:
            if await probe():
                return False
            _begin(exc, where)
    _episode.errors += 1
    return True


def _begin(exc: BaseException, where: str) -> None:
    _episode.down_since = time.monotonic()
    _episode.errors = 0
    _episode.back.clear()
    detail = str(exc).splitlines()[0] if str(exc) else ""
    log.warning(
        "database unreachable (%s: %s, first seen by %s); every loop retries, /healthz "
        "still answers",
        type(exc).__name__,
        detail,
        where,
    )


async def _end() -> None:
    since = _episode.down_since
    if since is None:
        return
    log.warning(
        "database back after %.1f s (%d errors meanwhile); resuming",
        time.monotonic() - since,
        _episode.errors,
    )
    _episode.down_since = None
    # Connections that lived through the outage may be half-broken: each is replaced when
    # next acquired, instead of failing once more where a loop happens to pick it.
    for pool in list(_pools):
        if not pool.is_closing():
            await pool.expire_connections()
    _episode.back.set()


async def wait_back(stopping: asyncio.Event, seconds: float) -> None:
    """Sleep up to ``seconds``, but wake when ``stopping`` is set or an outage ends."""
    waits = [asyncio.ensure_future(stopping.wait())]
    if down():
        waits.append(asyncio.ensure_future(_episode.back.wait()))
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waits:
            waiter.cancel()


class _QuietPoolFloor(logging.Filter):
    """asyncpg's pool logs a traceback each time it fails to reconnect its minimum of
    connections: during an outage that is the outage again, already logged once."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and is_connection_error(exc) and _episode.dsn is not None:
            _episode.errors += 1
            return False
        return True


logging.getLogger("asyncpg.pool").addFilter(_QuietPoolFloor())


def _raise_gone(exit_after: float) -> None:
    raise DatabaseGoneError(
        f"the database stayed unreachable for {exit_after:g} s "
        "(SUPERAGENT_DATABASE_OUTAGE_EXIT_SECONDS); exiting"
    )


async def watch(stopping: asyncio.Event, *, exit_after: float) -> None:
    """While an outage lasts, probe once a second and end it when the database answers."""
    while not stopping.is_set():
        since = _episode.down_since
        if since is not None:
            if await probe():
                await _end()
            elif exit_after and time.monotonic() - since >= exit_after:
                log.error(
                    "database unreachable for %.0f s, past "
                    "SUPERAGENT_DATABASE_OUTAGE_EXIT_SECONDS; exiting",
                    time.monotonic() - since,
                )
                _raise_gone(exit_after)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), _PROBE_EVERY)
