"""The effect runner: claim in batches, execute concurrently, complete in batches.

Protocol (all on raw asyncpg, the hot path of every external action):

* **Claim** ``LIMIT n FOR UPDATE SKIP LOCKED`` over the partial ready index, in one short
  statement that also sets ``locked_by`` and pushes ``next_attempt_at`` to now + lease.
  Claiming counts an attempt, so an effect that kills its runner cannot loop forever, and
  a claim (``claims``, never reset), so a handler knows whether it may have run before.
* **Execute** handlers as tasks, at most ``concurrency`` at once. While they run, a renewal
  loop keeps extending their leases; only a dead runner lets a lease lapse, and then another
  runner retries the effect.
* **Complete** in batches: delete where (id, generation) still match. An effect whose payload
  was replaced meanwhile has a newer generation; it is released to run again instead.
* **Fail** with exponential backoff and jitter, parking the effect as dead after
  ``max_attempts``. :class:`Postpone` reschedules without counting a failure.
* **Wake** on LISTEN/NOTIFY (``db/listen.py``: a dedicated connection, kept up), with a
  polling fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import asyncpg

from controlplane import failures
from controlplane.db import pool as db_pool
from controlplane.db.listen import listen
from controlplane.domain import Notify
from controlplane.effects.handlers import ClaimedEffect, Handlers, Permanent, Postpone
from controlplane.services import Service, critical_loop, sleep_unless
from controlplane.settings import EffectsSettings
from superagent_shared import backoff

log = logging.getLogger(__name__)

_CLAIM = """
WITH ready AS (
    SELECT id FROM effects
    WHERE dead_at IS NULL AND next_attempt_at <= now()
    ORDER BY next_attempt_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE effects e
SET locked_by = $2, next_attempt_at = now() + $3::interval, attempts = e.attempts + 1,
    claims = e.claims + 1
FROM ready WHERE e.id = ready.id
RETURNING e.id, e.kind, e.key, e.payload, e.generation, e.attempts, e.claims
"""

# Delete what finished at the generation it ran; release what was replaced meanwhile.
# The two parts touch disjoint rows (generation equal vs. different).
_COMPLETE = """
WITH done AS (SELECT * FROM unnest($1::text[], $2::int[]) AS d(id, generation)),
deleted AS (
    DELETE FROM effects e USING done
    WHERE e.id = done.id AND e.generation = done.generation
    RETURNING e.id
)
UPDATE effects e SET locked_by = NULL, next_attempt_at = now(), attempts = 0
FROM done
WHERE e.id = done.id AND e.generation <> done.generation AND e.locked_by = $3
"""

_FAIL = """
UPDATE effects SET
    locked_by = NULL,
    last_error = CASE WHEN generation = $2 THEN $3 ELSE NULL END,
    attempts = CASE WHEN generation = $2 THEN attempts ELSE 0 END,
    next_attempt_at = CASE WHEN generation = $2 THEN now() + $4::interval ELSE now() END,
    dead_at = CASE WHEN generation = $2 AND attempts >= $5 THEN now() ELSE NULL END
WHERE id = $1 AND locked_by = $6
"""

_POSTPONE = """
UPDATE effects SET locked_by = NULL, attempts = greatest(attempts - 1, 0),
    next_attempt_at = now() + $2::interval
WHERE id = $1 AND locked_by = $3
"""

_RENEW = """
UPDATE effects SET next_attempt_at = now() + $2::interval
WHERE id = ANY($1::text[]) AND locked_by = $3
"""

_LAST_ERROR_LIMIT = 4000


# Every runner statement is a short walk over an index: the ready index in order for a
# claim, the primary key for the rest, whatever the statistics say. They are wrong exactly
# when it matters: an outbox idles near empty, then a burst lands, and autoanalyze catches
# up only a minute later. Meanwhile a claim sorted the whole backlog (stale statistics), or
# its prepared statement, gone generic while the table was empty, joined by a full scan
# of it: 0.6 to 2.7 thousand effects/s instead of 15 to 20 (bench/RESULTS.md). So: plan each
# execution for the table as it is now (planning costs ~0.2 ms), and penalise every plan
# shape but index scans and nested loops (a penalty, not a ban: nothing fails to plan).
# Session settings of the runner's own pool; a pool passed in should set them too.
_PLAN_SETTINGS = {
    "plan_cache_mode": "force_custom_plan",
    "enable_seqscan": "off",
    "enable_bitmapscan": "off",
    "enable_sort": "off",
    "enable_hashjoin": "off",
    "enable_mergejoin": "off",
}


async def create_pool(dsn: str, *, size: int = 4) -> asyncpg.Pool:
    """The runner's pool, with the planner settings above."""
    return await db_pool.create_pool(dsn, size=size, server_settings=_PLAN_SETTINGS)


def runner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"


@dataclass(slots=True)
class _Done:
    id: str
    generation: int


class EffectRunner(Service):
    """Executes effects of the kinds in ``handlers``; any number may run on any replicas."""

    name = "effects"

    def __init__(
        self,
        dsn: str,
        handlers: Handlers,
        settings: EffectsSettings | None = None,
        *,
        pool: asyncpg.Pool | None = None,
        owner: str | None = None,
    ) -> None:
        super().__init__()
        self.dsn = dsn
        self.handlers = handlers
        self.settings = settings or EffectsSettings()
        self.owner = owner or runner_id()
        self._pool = pool
        self._own_pool = pool is None
        self._listener = listen(dsn, Notify.EFFECTS, name=self.name)
        # Also set when a slot frees up, and on stop.
        self._wake = self._listener.wake
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._done: list[_Done] = []
        self._flush_wanted = asyncio.Event()
        self._lease = timedelta(seconds=self.settings.lease_seconds)
        self._drain_timeout = self.settings.lease_seconds / 3

    # -- lifecycle -----------------------------------------------------------------------

    async def run(self) -> None:
        if self._pool is None:
            self._pool = await create_pool(self.dsn, size=4)
        # Anything enqueued while not listening is found by the claim its connect wakes.
        await self._listener.start()
        helpers = [
            asyncio.create_task(critical_loop("effects.flush", self._flush_step, self.stopping)),
            asyncio.create_task(critical_loop("effects.renew", self._renew_step, self.stopping)),
        ]
        try:
            await critical_loop("effects.claim", self._claim_step, self.stopping)
        finally:
            await self._drain()
            for helper in helpers:
                helper.cancel()
            for helper in helpers:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await helper
            await self._flush()
            await self._listener.close()
            if self._own_pool and self._pool is not None:
                await self._pool.close()
                self._pool = None

    async def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        self._wake.set()  # the claim loop may be waiting for a notification
        self._drain_timeout = timeout * 0.6  # leave time to release what does not finish
        await super().stop(timeout)

    async def _drain(self) -> None:
        """Let running handlers finish within the lease; release those that do not."""
        if not self._inflight:
            return
        tasks = list(self._inflight.values())
        _, pending = await asyncio.wait(tasks, timeout=self._drain_timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    # -- claiming ------------------------------------------------------------------------

    async def _claim_step(self) -> None:
        assert self._pool is not None
        if self.stopping.is_set():
            return
        free = self.settings.concurrency - len(self._inflight)
        if free <= 0:
            await self._listener.wait(self.settings.poll_interval_seconds)
            return
        limit = min(free, self.settings.batch_size)
        # Clear before claiming: a notification that arrives during the claim must still
        # wake the next round.
        self._wake.clear()
        rows = await self._pool.fetch(_CLAIM, limit, self.owner, self._lease)
        for row in rows:
            effect = ClaimedEffect(
                id=row["id"],
                kind=row["kind"],
                key=row["key"],
                payload=row["payload"],
                generation=row["generation"],
                attempt=row["attempts"],
                claims=row["claims"],
            )
            task = asyncio.create_task(self._execute(effect), name=f"effect:{effect.id}")
            self._inflight[effect.id] = task
        if len(rows) < limit:
            await self._listener.wait(self.settings.poll_interval_seconds)

    # -- executing -----------------------------------------------------------------------

    async def _execute(self, effect: ClaimedEffect) -> None:
        try:
            handler = self.handlers.get(effect.kind)
            if handler is None:
                raise LookupError(f"no handler for effect kind {effect.kind!r} on this replica")
            await handler(effect)
        except Postpone as later:
            await self._settle(_POSTPONE, effect.id, timedelta(seconds=later.seconds), self.owner)
        except asyncio.CancelledError:
            # Stopping: hand it back at once rather than waiting for the lease to lapse.
            await self._settle(_POSTPONE, effect.id, timedelta(0), self.owner)
            raise
        except Exception as exc:
            await self._record_failure(effect, exc)
        else:
            self._done.append(_Done(effect.id, effect.generation))
            self._flush_wanted.set()
        finally:
            self._inflight.pop(effect.id, None)
            self._wake.set()  # a slot is free

    async def _record_failure(self, effect: ClaimedEffect, exc: Exception) -> None:
        wait = backoff.delay(
            effect.attempt,
            base=self.settings.backoff_base_seconds,
            cap=self.settings.backoff_max_seconds,
        )
        summary = "".join(traceback.format_exception_only(exc)).strip()
        # A permanent failure is parked now: retrying it would only repeat the error.
        limit = 0 if isinstance(exc, Permanent) else self.settings.max_attempts
        dead = effect.attempt >= limit
        log.warning(
            "effect %s (%s) attempt %d failed: %s; %s",
            effect.id,
            effect.kind,
            effect.attempt,
            summary,
            "parked as dead" if dead else f"retry in {wait:.1f}s",
        )
        await self._settle(
            _FAIL,
            effect.id,
            effect.generation,
            summary[:_LAST_ERROR_LIMIT],
            timedelta(seconds=wait),
            limit,
            self.owner,
        )
        if dead:
            assert self._pool is not None
            with contextlib.suppress(Exception):  # the effect's own row is the record
                await failures.record(
                    self._pool, "effects", f"{effect.id} {effect.kind}", exc, quarantined=True
                )

    async def _settle(self, query: str, *args: Any) -> None:
        """Write one effect's outcome; a failure here leaves it to the lease, never lost."""
        assert self._pool is not None
        try:
            await self._pool.execute(query, *args)
        except Exception:
            log.warning(
                "could not record an effect outcome; the lease will retry it", exc_info=True
            )

    # -- completing ----------------------------------------------------------------------

    async def _flush_step(self) -> None:
        await self._flush_wanted.wait()
        self._flush_wanted.clear()
        await self._flush()

    async def _flush(self) -> None:
        if not self._done or self._pool is None:
            return
        batch, self._done = self._done, []
        try:
            await self._pool.execute(
                _COMPLETE, [d.id for d in batch], [d.generation for d in batch], self.owner
            )
        except BaseException:
            self._done[:0] = batch  # try again on the next round
            raise

    async def _renew_step(self) -> None:
        await sleep_unless(self.stopping, self.settings.lease_seconds / 3)
        ids = list(self._inflight)
        if ids and self._pool is not None:
            await self._pool.execute(_RENEW, ids, self._lease, self.owner)
