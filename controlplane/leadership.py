"""Leader election by a lease row in Postgres (docs/architecture.md,
*Rules everything relies on*, rule 5).

A replica holds the ``router`` lease while it renews it, every ``renew_seconds``, before it
expires (``lease_seconds`` after the last renewal, by the database's clock, so replicas'
clocks do not matter). Others try to take it at the same interval, and get it once it has
expired: a leader that dies is replaced within ``lease_seconds + renew_seconds``. A leader
that stops cleanly gives the lease up at once.

Only single statements, no advisory locks or session state: this works behind a
transaction-pooling proxy such as PgBouncer.

A replica counts itself leader only until its own deadline, measured from *before* it sent
the renewal and a second short of the lease, so it stops acting before anyone else can take
over, even if its renewals stall.

The one writer of ``leases``; a process that only says it is alive (the watchdog's mark,
``superagent status`` reads it) stamps a row of its own with :func:`mark`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg

from controlplane.db import outage
from controlplane.services import Service, is_transient, sleep_unless

log = logging.getLogger(__name__)

ROUTER_LEASE = "router"
_SAFETY_SECONDS = 1.0

_CLAIM = """
INSERT INTO leases (name, holder, acquired_at, renewed_at, expires_at)
VALUES ($1, $2, now(), now(), now() + $3::interval)
ON CONFLICT (name) DO UPDATE SET
    holder = excluded.holder,
    acquired_at = CASE WHEN leases.holder = excluded.holder THEN leases.acquired_at
                       ELSE now() END,
    renewed_at = now(),
    expires_at = excluded.expires_at
WHERE leases.holder = excluded.holder OR leases.expires_at < now()
RETURNING acquired_at
"""


@dataclass(frozen=True)
class LeaseView:
    name: str
    holder: str
    acquired_at: datetime
    renewed_at: datetime
    expires_at: datetime
    expired: bool


async def claim(pool: asyncpg.Pool, name: str, holder: str, seconds: float) -> bool:
    """Take or renew ``name`` for ``holder``; False if someone else holds it."""
    acquired = await pool.fetchval(_CLAIM, name, holder, timedelta(seconds=seconds))
    return acquired is not None


async def mark(pool: asyncpg.Pool, name: str, holder: str, ttl: timedelta) -> None:
    """``holder`` is alive for ``ttl``: the row ``name`` is theirs, whoever had it."""
    await pool.execute(
        "INSERT INTO leases (name, holder, acquired_at, renewed_at, expires_at) "
        "VALUES ($1, $2, now(), now(), now() + $3::interval) "
        "ON CONFLICT (name) DO UPDATE SET expires_at = EXCLUDED.expires_at, "
        "renewed_at = now(), "
        "acquired_at = CASE WHEN leases.holder = EXCLUDED.holder THEN leases.acquired_at "
        "ELSE now() END, holder = EXCLUDED.holder",
        name,
        holder,
        ttl,
    )


async def release(pool: asyncpg.Pool, name: str, holder: str) -> None:
    await pool.execute("DELETE FROM leases WHERE name = $1 AND holder = $2", name, holder)


async def current(pool: asyncpg.Pool, name: str) -> LeaseView | None:
    row = await pool.fetchrow(
        "SELECT name, holder, acquired_at, renewed_at, expires_at, expires_at < now() AS expired "
        "FROM leases WHERE name = $1",
        name,
    )
    return None if row is None else LeaseView(**dict(row))


class Leadership(Service):
    """Holds (or waits for) one lease; ``is_leader`` says whether this replica may act."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        holder: str,
        *,
        lease: str = ROUTER_LEASE,
        lease_seconds: float = 15.0,
        renew_seconds: float = 5.0,
    ) -> None:
        super().__init__()
        self.name = f"leader:{lease}"
        self.pool = pool
        self.holder = holder
        self.lease = lease
        self.lease_seconds = lease_seconds
        self.renew_seconds = renew_seconds
        self._deadline = 0.0  # monotonic; leader until then
        self.gained = asyncio.Event()  # set while leader
        self.lost = asyncio.Event()  # set while not leader
        self.lost.set()

    @property
    def is_leader(self) -> bool:
        return time.monotonic() < self._deadline

    async def run(self) -> None:
        try:
            while not self.stopping.is_set():
                await self._attempt()
                # Wake early when our own deadline would pass before the next attempt.
                wait = self.renew_seconds
                if self.is_leader:
                    wait = min(wait, max(self._deadline - time.monotonic(), 0.0))
                # Woken early too when a database outage ends: leadership resumes at once.
                await outage.wait_back(self.stopping, wait)
                self._note()
        finally:
            if self.is_leader or self.gained.is_set():
                self._deadline = 0.0
                self._note()
                try:
                    await asyncio.shield(release(self.pool, self.lease, self.holder))
                    log.info("gave up the %s lease", self.lease)
                except Exception:  # it expires by itself
                    log.warning("could not give up the %s lease", self.lease, exc_info=True)

    async def _attempt(self) -> None:
        sent = time.monotonic()
        try:
            held = await claim(self.pool, self.lease, self.holder, self.lease_seconds)
        except Exception as exc:
            if not is_transient(exc):
                raise
            if not await outage.absorbed(exc, f"{self.lease} lease"):
                log.warning("could not renew the %s lease: %s", self.lease, exc)
            return  # leader still, until the deadline
        self._deadline = sent + self.lease_seconds - _SAFETY_SECONDS if held else 0.0
        self._note()

    def _note(self) -> None:
        """Keep the events in step with ``is_leader``, logging each change."""
        if self.is_leader and not self.gained.is_set():
            log.info("this replica (%s) now leads %s", self.holder, self.lease)
            self.lost.clear()
            self.gained.set()
        elif not self.is_leader and self.gained.is_set():
            # Lost (a lease that could not be renewed) is news; handed back on a stop is not.
            level = logging.INFO if self.stopping.is_set() else logging.WARNING
            log.log(level, "this replica (%s) no longer leads %s", self.holder, self.lease)
            self.gained.clear()
            self.lost.set()


class WhileLeading(Service):
    """Runs a fresh service from ``make`` while this replica leads, and stops it when the
    lease is lost: loops that must run once per deployment (polling, sync)."""

    def __init__(self, make: Callable[[], Service], leadership: Leadership) -> None:
        super().__init__()
        self.make = make
        self.leadership = leadership
        self.name = f"while-leading:{make().name}"

    async def run(self) -> None:
        while not self.stopping.is_set():
            if not self.leadership.is_leader:
                await sleep_unless(self.stopping, 0.2)
                continue
            inner = self.make()
            await inner.start()
            try:
                while self.leadership.is_leader and not self.stopping.is_set():
                    if inner.task.done():
                        inner.task.result()  # a failure stops the replica, loudly
                        raise RuntimeError(f"{inner.name} stopped unexpectedly")
                    await sleep_unless(self.stopping, 0.2)
            finally:
                await inner.stop()
