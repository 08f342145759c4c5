"""Long-running loops as Services, and the one critical-loop helper they all share.

A Service owns one loop. ``start()`` launches it, ``stop()`` asks it to finish and waits a
bounded time before cancelling. Inside, :func:`critical_loop` repeats a step: errors that may
pass by themselves (a dropped connection, a Postgres restart, a timeout) are retried with
backoff and jitter; anything else is a bug or a broken configuration and is re-raised so
:func:`run_services` stops the process loudly instead of limping on.

The step is one turn, pass or round of the loop, and does its own waiting. What fails only
an item of work (a router turn, a worker round, a watchdog check) is the step's to contain:
it records the failure and waits its own backoff, and the loop never sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable

import asyncpg

from controlplane.db import outage
from controlplane.errors import TransientError
from superagent_shared import backoff

log = logging.getLogger(__name__)

# Of a process's shutdown timeout, the share its loops get to finish; the rest is for
# closing pools and the embedded database before the process's deadline ends it anyway.
LOOPS_SHARE = 0.75
# How long a cancelled loop may take to unwind before it is left behind.
_CANCEL_GRACE = 1.0
# What a service still gets once the stop's budget is spent: a moment to notice.
_LAST_CHANCE = 0.1

_TRANSIENT: tuple[type[BaseException], ...] = (
    TransientError,
    OSError,  # includes ConnectionError and TimeoutError
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.OperatorInterventionError,  # admin shutdown, cannot connect now
    asyncpg.exceptions.SerializationError,
    asyncpg.exceptions.DeadlockDetectedError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.InternalClientError,  # a connection broken mid-operation by an outage
)


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, _TRANSIENT)


def is_transient_or_database(exc: BaseException) -> bool:
    """Transient, or any answer of the database, a failing statement included: what a loop
    whose every pass is queries retries instead of ending (the workers', the watchdog's)."""
    return is_transient(exc) or isinstance(exc, asyncpg.PostgresError)


async def sleep_unless(event: asyncio.Event, seconds: float) -> bool:
    """Sleep up to ``seconds``; return True at once if ``event`` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout=seconds)
    return event.is_set()


async def critical_loop(
    name: str,
    step: Callable[[], Awaitable[None]],
    stopping: asyncio.Event,
    *,
    backoff_cap: float = 30.0,
    retry: Callable[[BaseException], bool] = is_transient,
) -> None:
    """Run ``step`` until ``stopping`` is set; ``step`` does its own waiting between rounds.

    An error ``retry`` accepts (by default the transient ones) is retried after a backoff
    (``superagent_shared.backoff``, up to ``backoff_cap`` seconds); any other ends the loop.
    A database outage is one episode for the whole process (``db/outage.py``): this loop
    logs nothing of its own for it, and retries as soon as the database is back.
    """
    failures = 0
    while not stopping.is_set():
        try:
            await step()
        except Exception as exc:
            if not retry(exc):
                log.exception("%s: unexpected error, stopping the loop", name)
                raise
            failures += 1
            wait = backoff.delay(failures, base=0.2, cap=backoff_cap)
            if await outage.absorbed(exc, name):
                log.debug("%s: database unreachable; retry %d in %.1fs", name, failures, wait)
            else:
                log.warning(
                    "%s: transient error (%s: %s); retry %d in %.1fs",
                    name,
                    type(exc).__name__,
                    exc,
                    failures,
                    wait,
                )
            await outage.wait_back(stopping, wait)
        else:
            failures = 0


class Service(ABC):
    """One long-running loop with start/stop. Subclasses implement :meth:`run`."""

    name: str = "service"

    def __init__(self) -> None:
        self.stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @abstractmethod
    async def run(self) -> None:
        """Work until ``self.stopping`` is set, then finish promptly."""

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError(f"{self.name} already started")
        self._task = asyncio.create_task(self.run(), name=self.name)

    @property
    def task(self) -> asyncio.Task[None]:
        if self._task is None:
            raise RuntimeError(f"{self.name} was not started")
        return self._task

    async def stop(self, timeout: float = 5.0) -> None:
        """Ask the loop to finish; cancel it if it has not within ``timeout``. Idempotent."""
        self.stopping.set()
        task = self._task
        if task is None or task.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout)
        except TimeoutError:
            log.warning("%s did not stop within %.1fs; cancelling", self.name, timeout)
            task.cancel()
            # A loop that swallows the cancellation must not hold up the rest of the stop.
            done, _ = await asyncio.wait([task], timeout=_CANCEL_GRACE)
            if not done:
                log.warning("%s ignored its cancellation; leaving it behind", self.name)
        except asyncio.CancelledError:
            raise
        except Exception:  # the loop's own failure was already logged
            log.debug("%s ended with an error during stop", self.name, exc_info=True)


class DatabaseWatch(Service):
    """Ends a database outage episode when Postgres answers again (see ``db/outage.py``),
    and ends the process if it stays away past ``exit_after`` seconds (0: never)."""

    name = "database-watch"

    def __init__(self, dsn: str, *, exit_after: float) -> None:
        super().__init__()
        self.dsn = dsn
        self.exit_after = exit_after

    async def run(self) -> None:
        outage.configure(self.dsn)
        try:
            await outage.watch(self.stopping, exit_after=self.exit_after)
        finally:
            outage.configure(None)


async def run_services(
    services: list[Service], stop: asyncio.Event, *, shutdown_timeout: float = 5.0
) -> None:
    """Start ``services`` in order; return when ``stop`` is set, or raise when one fails.

    Shutdown runs in reverse start order (intake first stopped last-started), and the whole
    shutdown is bounded by ``shutdown_timeout``.
    """
    started: list[Service] = []
    try:
        for service in services:
            await service.start()
            started.append(service)
        stop_task = asyncio.create_task(stop.wait(), name="stop-signal")
        try:
            done, _ = await asyncio.wait(
                [stop_task, *(s.task for s in started)],
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            stop_task.cancel()
        for task in done:
            if task is not stop_task:
                failed = next(s for s in started if s.task is task)
                exc = task.exception() if not task.cancelled() else None
                if exc is not None:
                    raise exc
                raise RuntimeError(f"{failed.name} stopped unexpectedly")
    finally:
        # One budget for the whole stop: each service may take what the ones before it
        # left (a child process needs most of a second; an equal share cut it off).
        deadline = time.monotonic() + shutdown_timeout
        for service in reversed(started):
            await service.stop(max(_LAST_CHANCE, deadline - time.monotonic()))
