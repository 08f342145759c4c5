"""The watchdog: a separate process (``superagent watchdog``) on a timer, outside the
replicas, over the same Postgres (docs/architecture.md, *The watchdog*).

Every ``interval_seconds`` it runs the checks (``checks.py``, and ``drift.py`` when a model
is configured), records what it sees (``findings.py``), and acts by a fixed ladder:

* a worker with no progress for ``stall_seconds``: nudged; for twice as long: requeued
  (another replica resumes its session); three times: stopped, and the admin alerted;
* a worker going round in circles: nudged, then stopped if it keeps on;
* a worker off its ticket's goal (the model's judgement): nudged with the reason;
* commands past their expiry that were never delivered: expired, so their tickets hear;
* model calls failing in a row: the admin alerted, and with ``pause_after_errors`` the
  agent paused;
* a silent replica, no replica at all, a leaderless router, an orphaned lease, outbox
  actions that keep failing, Postgres unreachable: the admin alerted.

Each finding is acted on once per rung; everything is on record (``superagent watchdog
findings``). One check that fails (a bug in it) is that check's failure, recorded in
``item_failures``; the other checks still run. :class:`Watchdog` is a Service on the shared
loop (:func:`controlplane.services.critical_loop`), one pass a step.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import asyncpg
import openai

from controlplane import failures, findings, leadership
from controlplane.deployment import WATCHDOG_MARK
from controlplane.findings import Open, Seen
from controlplane.gateway import queue as commands
from controlplane.services import Service, critical_loop, is_transient_or_database, sleep_unless
from controlplane.settings import Settings
from controlplane.watchdog import actions, checks, drift

log = logging.getLogger(__name__)

Check = Callable[[asyncpg.Pool, Settings], Awaitable[list[Seen]]]
# Each check, and the kinds of finding it owns (a kind it does not see this pass resolves).
CHECKS: list[tuple[Check, tuple[str, ...]]] = [
    (checks.replicas, ("replica_silent", "no_replica")),
    (checks.leases, ("router_leaderless", "lease_expired")),
    (checks.errors, ("llm_errors", "effects_failing")),
    (checks.device_queues, ("queue_expired",)),
    (checks.workers, ("stalled", "looping")),
]
ALERT_KINDS = frozenset(
    {
        "replica_silent",
        "no_replica",
        "router_leaderless",
        "lease_expired",
        "llm_errors",
        "effects_failing",
    }
)


class Watchdog(Service):
    name = "watchdog"

    def __init__(
        self, pool: asyncpg.Pool, settings: Settings, client: openai.AsyncOpenAI | None
    ) -> None:
        super().__init__()
        self.pool = pool
        self.settings = settings
        self.config = settings.watchdog
        self.drift = drift.DriftCheck(pool, client, settings) if client is not None else None
        self.down_since: datetime | None = None
        self.passes = 0

    async def run(self) -> None:
        await critical_loop(self.name, self._pass, self.stopping)

    async def _pass(self) -> None:
        """One pass, then the interval. Postgres unreachable or failing ends the pass, and
        is itself a finding: the watchdog keeps its interval through the outage (no
        backoff: it is the one that reports it) and records the episode once it is over
        (:meth:`_postgres_was_down`). Anything else is a bug and ends the loop."""
        try:
            await self.check_once()
        except Exception as exc:
            if not is_transient_or_database(exc):
                raise
            if self.down_since is None:  # one line per outage, not one per pass
                self.down_since = datetime.now(UTC)
                log.error("watchdog: Postgres unreachable or failing (%s); retrying", exc)
            else:
                log.debug("watchdog: Postgres still unreachable (%s)", exc)
        await sleep_unless(self.stopping, self.config.interval_seconds)

    async def check_once(self) -> list[Open]:
        """One pass: every check, then the actions its findings call for."""
        if self.down_since is not None:
            await self._postgres_was_down()
        seen_all: list[Open] = []
        for check, kinds in CHECKS:
            try:
                seen_all += await self._run_check(check, kinds)
            except Exception as exc:
                await self._check_failed(check.__name__, exc)
        if self.drift is not None:
            try:
                seen_all += await self._drift(self.drift)
            except Exception as exc:
                await self._check_failed("drift", exc)
        self.passes += 1
        await self._mark_pass()
        return seen_all

    async def _mark_pass(self) -> None:
        """Say the watchdog is alive (``superagent status`` shows it): a row in ``leases``
        that stays valid for three passes."""
        await leadership.mark(
            self.pool,
            WATCHDOG_MARK,
            f"{socket.gethostname()}:{os.getpid()}",
            timedelta(seconds=self.config.interval_seconds * 3),
        )

    async def _run_check(self, check: Check, kinds: tuple[str, ...]) -> list[Open]:
        seen = await check(self.pool, self.settings)
        out: list[Open] = []
        for kind in kinds:
            recorded = await findings.record(self.pool, kind, [s for s in seen if s.kind == kind])
            for finding in recorded:
                await self._act(
                    finding,
                    next(s for s in seen if s.subject == finding.subject and s.kind == kind),
                )
            out += recorded
        return out

    async def _check_failed(self, name: str, exc: Exception) -> None:
        """One check failing is that check's failure this pass; the others still run. Only
        the database going away ends the pass (and is reported once, by :meth:`run`)."""
        if is_transient_or_database(exc):
            raise exc
        failures.logged(log, "watchdog", name, exc, "the other checks go on")
        await failures.record(self.pool, "watchdog", name, exc)

    async def _drift(self, check: drift.DriftCheck) -> list[Open]:
        recorded = await findings.record(self.pool, "drift", await check.check())
        for finding in recorded:
            if "nudge" not in finding.actions:
                await actions.nudge(
                    self.pool,
                    finding,
                    finding.subject,
                    f"The watchdog thinks you may be drifting from this ticket's goal: "
                    f"{finding.summary} Get back to the scope, or report why not.",
                )
        return recorded

    async def _act(self, finding: Open, seen: Seen) -> None:
        done = finding.actions
        if finding.kind in ALERT_KINDS and "alert" not in done:
            await actions.alert(self.pool, self.config, finding, seen.summary)
        if finding.kind == "llm_errors":
            streak = int(seen.details.get("streak", 0))
            limit = self.config.pause_after_errors
            if limit and streak >= limit and "pause" not in done:
                await actions.pause_agent(
                    self.pool, finding, f"{streak} model calls failed in a row: {seen.summary}"
                )
        elif finding.kind == "queue_expired":
            await self._expire(finding)
        elif finding.kind == "stalled":
            await self._unstall(finding, float(seen.details.get("idle_minutes", 0)))
        elif finding.kind == "looping":
            if "nudge" not in done:
                await actions.nudge(
                    self.pool,
                    finding,
                    finding.subject,
                    "The watchdog sees you repeating the same tool calls. Step back: try a "
                    "different approach, or report blocked with what you tried.",
                )
            elif finding.times_seen >= 3 and "stop" not in done:
                await actions.stop(self.pool, finding, finding.subject, "it kept repeating itself")
                await actions.alert(
                    self.pool,
                    self.config,
                    finding,
                    f"stopped {finding.subject}: it kept repeating the same tool calls",
                )

    async def _unstall(self, finding: Open, idle_minutes: float) -> None:
        stall, done = self.config.stall_seconds / 60, finding.actions  # in minutes, as idle_minutes
        if idle_minutes >= 3 * stall:
            if "stop" not in done:
                why = f"it made no progress for {idle_minutes:.0f} minutes"
                await actions.stop(self.pool, finding, finding.subject, why)
                await actions.alert(
                    self.pool, self.config, finding, f"stopped {finding.subject}: {why}"
                )
        elif idle_minutes >= 2 * stall:
            if "requeue" not in done:
                await actions.requeue(self.pool, finding, finding.subject)
        elif "nudge" not in done:
            await actions.nudge(
                self.pool,
                finding,
                finding.subject,
                f"The watchdog has seen no progress from you for {idle_minutes:.0f} minutes. "
                "Carry on, or report your status (blocked or question) if you cannot.",
            )

    async def _expire(self, finding: Open) -> None:
        expired = await commands.expire_undelivered(self.pool, finding.subject)
        if expired:
            await findings.acted(self.pool, finding.id, "expire", ", ".join(expired))

    async def _postgres_was_down(self) -> None:
        since = self.down_since
        assert since is not None
        self.down_since = None
        now = datetime.now(UTC)
        text = (
            f"Postgres was unreachable from the watchdog from {since:%H:%M:%S} to "
            f"{now:%H:%M:%S} UTC ({(now - since).total_seconds():.0f} s)"
        )
        recorded = await findings.record(
            self.pool,
            "postgres_unreachable",
            [Seen("postgres_unreachable", "postgres", "critical", text)],
        )
        for finding in recorded:
            await actions.alert(self.pool, self.config, finding, text)
        await findings.record(self.pool, "postgres_unreachable", [])  # over: resolved now
