"""What a failed router turn costs, and whom: the batch's triggers, or nobody.

:class:`Containment` takes every :class:`~controlplane.router.router.TurnFailed` the
router service catches, and never raises for one:

* the batch's failure (a malformed answer, a request the provider rejected (400), a
  prompt too long even after compaction, an exception in our own code): each trigger's
  ``route_attempts`` goes up, with the reason in ``route_error`` and an ``item_failures``
  row. Triggers that failed once are then taken alone (:mod:`controlplane.router.batch`),
  so the good events of a batch are decided in the next turns; a trigger whose lone turn
  fails ``router.quarantine_after`` times is set aside *undecidable* (routed, with
  ``undecidable_at``) and the admin told once, in one transaction;
  ``superagent triggers retry`` puts it back. A turn that ends without deciding a trigger
  (:class:`Undecided`: the model answered, but no accepted call decided it) is that
  trigger's failure, the same way.
* an explicit request set aside is never left unanswered: its thread is told in one line
  (:data:`GAVE_UP`), with the admin's alert, in the same transaction; a worker's report set
  aside is passed on to its thread as the worker wrote it, the same way.
* nobody's (the model unreachable: a transient failure after the client's retries, a bad
  key or unknown model, a quota; or the database gone): nothing is counted. After
  ``router.model_notice_seconds`` of an unreachable model, each thread waiting with an
  explicit request is told once that its message is queued, and the admin once per
  episode.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import asyncpg
import openai

from controlplane import failures
from controlplane.alerts import alert_admin
from controlplane.db import outage
from controlplane.ingest import routing
from controlplane.llm import LlmError
from controlplane.llm.errors import Permanent, Transient
from controlplane.replies import enqueue_reply
from controlplane.settings import RouterSettings
from superagent_shared.ids import stable_id

if TYPE_CHECKING:
    from controlplane.router.router import TurnFailed

log = logging.getLogger("controlplane.router.router")  # one logger for the router's story

# Model failures that are the deployment's, not the batch's: a bad key, no access, an
# unknown model, a quota or bill (with Transient, "the model is unreachable").
UNREACHABLE_STATUSES = frozenset({401, 402, 403, 404, 429})
MODEL_NOTICE = (
    "I can't reach my model right now; your message is queued and I'll answer as soon as it's back."
)
GAVE_UP = "I could not act on this request; an admin has been alerted."


class Undecided(Exception):
    """A turn ended without deciding these triggers: no accepted call decided them (a
    ticket, a reply, an ignore, ...: :attr:`~controlplane.router.tools.core.ToolResult.
    decided`). The model's failure, classed ``malformed`` (its
    answers were unusable for them), never silence."""

    failure_class = "malformed"

    def __init__(self, why: str) -> None:
        super().__init__(f"malformed: the turn ended without deciding it ({why})")


class Containment:
    """The router service's accounting of failed turns, and the unreachable model's clock."""

    def __init__(
        self, pool: asyncpg.Pool, settings: RouterSettings, admin_thread: str | None
    ) -> None:
        self.pool = pool
        self.settings = settings
        self.admin_thread = admin_thread
        # Since when the model has been unreachable (monotonic), and whether the admin was
        # told. In memory on purpose: the notices themselves are on record (model_notice_at,
        # stable message ids), so a new leader only starts its own clock.
        self._unreachable_since: float | None = None
        self._unreachable_alerted = False

    async def failed(self, failed: TurnFailed, backoff: float) -> bool:
        """Account for a failed turn; True: its trigger was set aside as undecidable.

        Never raises for an Exception: recording the failure may fail too (the database
        is gone), and then the batch is simply still queued.
        """
        cause = failed.cause
        try:
            if model_unreachable(cause):
                await self._unreachable(cause, backoff)
                return False
            if outage.database_trouble(cause):
                if not await outage.absorbed(cause, "router"):
                    log.warning(
                        "router turn failed (%s); the batch stays queued, retrying in %.0fs",
                        failures.describe(cause),
                        backoff,
                    )
                return False
            if isinstance(cause, LlmError | Undecided):
                self.reachable()  # it answered, if badly
            return await self._count(failed, backoff)
        except outage.DATABASE_ERRORS as exc:
            if not await outage.absorbed(exc, "router"):
                log.warning("router: cannot record a failed turn (%s); it stays queued", exc)
        except Exception:
            log.exception("router: cannot record a failed turn; it stays queued")
        return False

    async def _count(self, failed: TurnFailed, backoff: float) -> bool:
        """The failure counts against the batch's triggers; one alone past
        ``router.quarantine_after`` attempts is set aside, the admin told, in one
        transaction."""
        cause = failed.cause
        error = failures.describe(cause)
        ids = failed.trigger_ids
        item_id = _item_id(ids)
        async with self.pool.acquire() as conn, conn.transaction():
            rows = await routing.count_failed_turn(conn, ids, error)
            if failed.digest:
                # Listed for information only: a digest never fails a second turn.
                await routing.mark_digested(conn, failed.digest)
            quarantined = (
                failed.alone
                and len(rows) == 1
                and rows[0]["route_attempts"] >= self.settings.quarantine_after
            )
            if quarantined:
                trigger_id, attempts = rows[0]["id"], rows[0]["route_attempts"]
                await routing.set_aside(conn, trigger_id)
                thread = await conn.fetchrow(
                    "SELECT id, source, external_id FROM threads WHERE id = $1",
                    rows[0]["thread_id"],
                )
                where = (
                    f"{thread['id']} ({thread['source']}:{thread['external_id']})"
                    if thread is not None
                    else str(rows[0]["thread_id"])
                )
                await alert_admin(
                    conn,
                    self.admin_thread,
                    f"undecidable:{trigger_id}",
                    f"The router set event {trigger_id} on thread {where} aside as "
                    f"undecidable after {attempts} failed turns: {error}. Once the cause "
                    f"is fixed, `superagent triggers retry {trigger_id}` puts it back.",
                )
                told = _told(rows[0])
                if told is not None:
                    await enqueue_reply(
                        conn,
                        rows[0]["thread_id"],
                        told,
                        stable_id("msg", f"undecidable:{trigger_id}"),
                    )
            await failures.record(conn, "router", item_id, cause, quarantined=quarantined)
        if quarantined:
            then = "set aside as undecidable; the admin is told"
        elif failed.alone:
            then = f"it stays queued, retrying in {backoff:.1f}s"
        else:
            then = f"each is tried alone next, in {backoff:.1f}s"
        failures.logged(log, "router", item_id, cause, then)
        return quarantined

    async def _unreachable(self, cause: Exception, backoff: float) -> None:
        """Nobody's fault: nothing counted. Past ``router.model_notice_seconds``, each
        waiting thread is told once, and the admin once per outage episode."""
        now = time.monotonic()
        if self._unreachable_since is None:
            self._unreachable_since = now
        waited = now - self._unreachable_since
        log.warning(
            "router turn failed: the model is unreachable (%s) for %.0fs; the batch stays "
            "queued and counts against nobody, retrying in %.1fs",
            failures.describe(cause),
            waited,
            backoff,
        )
        if waited < self.settings.model_notice_seconds:
            return
        async with self.pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                "SELECT thread_id, (array_agg(id ORDER BY created_at, id))[1] AS first "
                "FROM triggers WHERE routed_at IS NULL GROUP BY thread_id "
                "HAVING bool_or(verdict = 'explicit') AND NOT bool_or(model_notice_at IS NOT NULL) "
                "ORDER BY min(created_at), thread_id"
            )
            for row in rows:
                await enqueue_reply(
                    conn,
                    row["thread_id"],
                    MODEL_NOTICE,
                    stable_id("msg", f"model-unreachable:{row['first']}"),
                )
            if rows:
                await routing.note_model_notice(conn, [row["thread_id"] for row in rows])
            if not self._unreachable_alerted:
                # Keyed by the oldest waiting event: a new leader in the same outage
                # raises the same alert, which is one message.
                oldest = await conn.fetchval(
                    "SELECT id FROM triggers WHERE routed_at IS NULL "
                    "ORDER BY created_at, id LIMIT 1"
                )
                await alert_admin(
                    conn,
                    self.admin_thread,
                    f"model-unreachable:{oldest}",
                    f"The router's model has been unreachable for {waited:.0f}s "
                    f"({failures.describe(cause)}); events wait in the inbox and the "
                    "threads waiting for an answer were told their messages are queued.",
                )
        self._unreachable_alerted = True

    def reachable(self) -> None:
        """The model answered: the unreachable clock starts again at the next outage."""
        if self._unreachable_since is not None:
            log.warning(
                "router: the model answers again after %.0fs",
                time.monotonic() - self._unreachable_since,
            )
        self._unreachable_since = None
        self._unreachable_alerted = False


def model_unreachable(exc: BaseException) -> bool:
    """The model cannot be reached or used at all: the deployment's failure, not a batch's
    (an outage after the client's own retries, a bad key, no access, an unknown model)."""
    if isinstance(exc, Transient):
        return True
    if isinstance(exc, Permanent):
        return exc.status in UNREACHABLE_STATUSES
    return isinstance(exc, openai.OpenAIError)  # raw: the boundary would have classified it


def _item_id(trigger_ids: Sequence[str]) -> str:
    """The failed item, for ``item_failures.item_id`` (at most 500 characters)."""
    text = ",".join(trigger_ids)
    if len(text) <= 500:
        return text
    shown: list[str] = []
    for trigger_id in trigger_ids:
        if len(",".join([*shown, trigger_id])) > 470:
            break
        shown.append(trigger_id)
    return ",".join(shown) + f",…(+{len(trigger_ids) - len(shown)})"


def _told(trigger: asyncpg.Record) -> str | None:
    """What the thread of a trigger set aside hears, if anything."""
    if trigger["verdict"] == "explicit":
        return GAVE_UP  # someone allowlisted asked: silence would look like being ignored
    if trigger["verdict"] == routing.REPORT_VERDICT:
        # A worker's report is written for the thread: passed on as written, it still tells
        # the person how their ticket ended when the router could not say it in its words.
        return str(trigger["text"])
    return None
