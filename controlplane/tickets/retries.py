"""A round that fails is the ticket's failure, retried with backoff, then blocked with a reason.

A round fails when its model keeps failing (the model client already retried transient
errors), answers malformed, or our own code raises while handling it. Nothing of that is
the worker service's failure: the round ends here, and

* the ticket goes back to ``open`` (hold ``retrying``) with ``retry_at`` after a backoff
  that doubles from ``workers.retry_base_seconds``, and its next round resumes the same
  session;
* after ``workers.failed_rounds_limit`` failed rounds in a row (a model step that succeeds
  starts the count over) it ends ``blocked``: the thread is told the cause in one line, the
  admin channel is alerted, and a person's message or ``superagent tickets retry`` wakes
  it for another ``failed_rounds_limit`` tries.

Every failed round is a row in ``item_failures`` (``/metrics`` counts them by class).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Literal

import asyncpg

from controlplane import failures
from controlplane.alerts import alert_admin
from controlplane.replies import enqueue_reply
from controlplane.settings import Settings
from controlplane.tickets import reports, slots, store
from superagent_shared import backoff
from superagent_shared.ids import stable_id

log = logging.getLogger(__name__)

HOLD = "retrying"  # tickets.hold of a ticket waiting out the backoff after a failed round
LOOP = "workers"
MAX_WAIT_SECONDS = 300.0

Outcome = Literal["retrying", "blocked", "gone"]


async def round_failed(
    pool: asyncpg.Pool, settings: Settings, assignment: slots.Assignment, exc: BaseException
) -> Outcome:
    """End the failed round and decide: back off, or block the ticket. Raises only when the
    database cannot be written (then the lease expires and the round is taken over)."""
    limits = settings.workers
    ticket_id = assignment.ticket_id
    reason = failures.describe(exc)
    async with pool.acquire() as conn, conn.transaction():
        row = await store.count_failed_round(conn, ticket_id, reason)
        if row is None:  # stopped or moved on meanwhile: only the round ends
            await slots.end(conn, assignment.id, "failed")
            await failures.record(conn, LOOP, ticket_id, exc)
            failures.logged(log, LOOP, ticket_id, exc, "the ticket has moved on")
            return "gone"
        count = int(row["failed_rounds"])
        if count < limits.failed_rounds_limit:
            wait = backoff.delay(count, base=limits.retry_base_seconds, cap=MAX_WAIT_SECONDS)
            await slots.end(conn, assignment.id, "failed")
            await store.retry_later(conn, ticket_id, HOLD, timedelta(seconds=wait))
            await failures.record(conn, LOOP, ticket_id, exc)
            failures.logged(
                log,
                LOOP,
                ticket_id,
                exc,
                f"round {count} of {limits.failed_rounds_limit} failed in a row; "
                f"retrying in {wait:.0f}s",
            )
            return "retrying"
        summary = f"{count} rounds in a row failed; the last: {reason}"
        await reports.finish_in(
            conn,
            ticket_id,
            assignment.id,
            {"status": "blocked", "summary": summary},
            to_router=False,  # said here: the router may depend on the same failing model
        )
        # A person's message or a retry gives it a fresh series of tries.
        await store.fresh_tries(conn, ticket_id)
        thread = await reports.home_thread(conn, ticket_id)
        if thread is not None:
            await enqueue_reply(
                conn,
                thread,
                f"{ticket_id} is blocked: {summary}. Reply here, or run `superagent tickets "
                f"retry {ticket_id}`, to try again.",
                stable_id("msg", f"rounds-failed:{assignment.id}"),
            )
        await alert_admin(
            conn,
            settings.watchdog.admin_thread,
            f"rounds-failed:{assignment.id}",
            f'{ticket_id} "{row["title"][:80]}" is blocked: {summary}',
        )
        await failures.record(conn, LOOP, ticket_id, exc, quarantined=True)
    failures.logged(log, LOOP, ticket_id, exc, "the ticket is blocked")
    return "blocked"
