"""The router's loop: the leader's turns, one after another, on the shared service loop.

:class:`RouterService` is a :class:`~controlplane.services.Service` whose step
(:func:`~controlplane.services.critical_loop`) is one turn: while this replica leads and
the agent is not paused, it takes a turn (:class:`~controlplane.router.router.Router`, or
rules-only mode's :class:`~controlplane.router.rules_only.RulesOnlyRouter`), woken by
NOTIFY with a 1 s poll.

Containment is the step's: a turn that fails (:class:`TurnFailed`) is its batch's failure
or nobody's (:mod:`controlplane.router.containment`), and the next turn waits a backoff
(``superagent_shared.backoff``) that starts over after a good turn; a bug before a batch
was taken is logged with its traceback and backed off likewise. None of these ends the
loop. The database gone (a transient error before a batch was taken) is the loop's: it
backs off, and resumes as soon as the database is back (``db/outage.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import asyncpg
import openai

from controlplane import pause
from controlplane.db import outage
from controlplane.db.listen import listen
from controlplane.domain import Notify
from controlplane.leadership import Leadership
from controlplane.router.containment import Containment
from controlplane.router.router import LostLeadership, TurnFailed
from controlplane.services import Service, critical_loop, is_transient, sleep_unless
from controlplane.settings import RouterSettings, Settings
from superagent_shared import backoff

# The router's story is told under one logger (containment.py logs there too).
log = logging.getLogger("controlplane.router.router")

# What a turn may raise before it takes a batch that is not a bug: the model provider's or
# the database's trouble, retried with backoff. Anything else is logged with its traceback.
_UNTAKEN_TURN_ERRORS: tuple[type[Exception], ...] = (openai.OpenAIError, *outage.DATABASE_ERRORS)

POLL_SECONDS = 1.0  # the safety net under LISTEN
FOLLOWER_POLL_SECONDS = 0.2  # how soon a replica that is not leading looks again


class TurnTaker(Protocol):
    async def turn(self, leading: Callable[[], bool] = ...) -> int: ...


class RouterService(Service):
    """Runs router turns while this replica leads (see the module)."""

    name = "router"

    def __init__(
        self,
        router: TurnTaker,
        leadership: Leadership,
        dsn: str,
        pool: asyncpg.Pool,
        *,
        settings: Settings | None = None,
        retry_base: float = 1.0,
        max_backoff: float | None = None,
    ) -> None:
        super().__init__()
        self.router = router
        self.pool = pool
        self.leadership = leadership
        self.dsn = dsn
        self.failures = Containment(
            pool,
            settings.router if settings is not None else RouterSettings(),
            settings.watchdog.admin_thread if settings is not None else None,
        )
        self.retry_base = retry_base
        # Between failed turns: doubling from retry_base, at most this.
        self.max_backoff = max_backoff or self.failures.settings.retry_cap_seconds
        self.backoff = backoff.Backoff(initial=retry_base, factor=2.0, cap=self.max_backoff)
        # Started once this replica first leads; then kept.
        self._listener = listen(dsn, Notify.ROUTER, name=self.name)

    async def run(self) -> None:
        try:
            await critical_loop(self.name, self._step, self.stopping, backoff_cap=self.max_backoff)
        finally:
            await self._listener.close()

    async def _step(self) -> None:
        """One turn if this replica leads and the agent is not paused, then its wait."""
        if not self.leadership.is_leader:
            await sleep_unless(self.stopping, FOLLOWER_POLL_SECONDS)
            return
        if await self._paused():
            await sleep_unless(self.stopping, POLL_SECONDS)  # events wait in the inbox
            return
        await self._listener.start()
        self._listener.wake.clear()  # what comes during the turn wakes the next
        try:
            consumed = await self.router.turn(lambda: self.leadership.is_leader)
        except LostLeadership:
            log.warning("router: leadership lost mid-turn; the batch stays queued")
            return
        except TurnFailed as failed:
            await self._turn_failed(failed)
            return
        except Exception as exc:
            if is_transient(exc):
                raise  # the database away, before a batch was taken: the loop's to wait out
            await self._untaken(exc)
            return
        self.backoff.reset()
        if consumed:
            self.failures.reachable()
            return  # more may have arrived during the model call
        await self._listener.wait(POLL_SECONDS, unless=self.stopping)

    async def _paused(self) -> bool:
        """Whether the agent is paused; an unreadable flag is taken for not paused (the
        turn then finds out whether the database is there)."""
        try:
            return await pause.current(self.pool) is not None
        except outage.DATABASE_ERRORS as exc:
            if not await outage.absorbed(exc, "router"):  # an outage is logged once
                log.warning("router: cannot read the pause flag (%s)", exc)
            return False

    async def _turn_failed(self, failed: TurnFailed) -> None:
        """The batch's failure or nobody's, never the loop's; the next turn backs off."""
        wait = self.backoff.next_delay()
        if await self.failures.failed(failed, wait):
            # Set aside: the next turn is another batch's, after the first backoff.
            self.backoff.reset()
            wait = self.backoff.next_delay()
        await sleep_unless(self.stopping, wait)

    async def _untaken(self, exc: Exception) -> None:
        """A turn that failed before taking its batch, other than by a transient error: the
        model provider's or the database's answer, or a bug; retried after a backoff."""
        wait = self.backoff.next_delay()
        if isinstance(exc, _UNTAKEN_TURN_ERRORS):
            log.warning("router turn failed (%s); retrying in %.0fs", exc, wait)
        else:
            log.error("router: a turn failed before taking its batch (a bug)", exc_info=exc)
        await sleep_unless(self.stopping, wait)
