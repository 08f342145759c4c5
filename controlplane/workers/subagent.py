"""The single-session baseline (``workers.design = single_session``), kept for comparison.

One session sees everything (no pass-through) and executes work by calling a ``subagent``
tool: the tool creates the ticket as ``create_ticket`` would, then runs a worker round to
its end inside the call and returns the worker's report. The session waits meanwhile, so
everything that arrives queues behind the running task. This is the design the two-tier
one (router + one worker per ticket) is measured against in ``bench/ablation.py``.

Not for production: a ticket whose device is away when the subagent runs waits in
``waiting_device`` with nobody to resume it (no worker service runs in this design).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta
from typing import Any

import asyncpg
import openai

from controlplane.domain import TicketState
from controlplane.gateway.queue import CommandQueue
from controlplane.settings import Settings
from controlplane.tickets import reports, slots
from controlplane.tools.names import SUBAGENT
from controlplane.workers.worker import RoundOver, Worker

log = logging.getLogger(__name__)


class Subagent:
    def __init__(
        self,
        pool: asyncpg.Pool,
        queue: CommandQueue,
        client: openai.AsyncOpenAI,
        settings: Settings,
        *,
        owner: str,
    ) -> None:
        self.pool = pool
        self.queue = queue
        self.client = client
        self.settings = settings
        self.owner = owner
        self.lease = timedelta(seconds=settings.workers.lease_seconds)

    async def run(self, ticket_id: str) -> dict[str, Any]:
        """Run the ticket's work to its end; the report, as the session reads it."""
        assignment = await slots.start(
            self.pool,
            ticket_id,
            states=(TicketState.OPEN,),
            woken_by=SUBAGENT,
            owner=self.owner,
            lease=self.lease,
            max_workers=self.settings.workers.max_workers,
            human=False,
        )
        if assignment is None:
            return {"ticket": ticket_id, "error": "no worker slot is free; try again later"}
        renewing = asyncio.create_task(self._renew(assignment.id))
        worker = Worker(
            self.pool, self.queue, self.client, self.settings, assignment, report_to_router=False
        )
        try:
            outcome = await worker.run()
        except RoundOver as over:
            outcome = str(over)
        finally:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing
        row = await self.pool.fetchrow(
            "SELECT status, summary, question, pr_url FROM reports WHERE ticket_id = $1 "
            "AND status <> 'progress' ORDER BY created_at DESC LIMIT 1",
            ticket_id,
        )
        used = await reports.spent(self.pool, ticket_id)
        result: dict[str, Any] = {"ticket": ticket_id, "outcome": outcome, "spent": used.line()}
        if row is not None:
            result.update(
                status=row["status"],
                summary=row["summary"],
                question=row["question"],
                pull_request=row["pr_url"],
            )
        return result

    async def _renew(self, assignment_id: str) -> None:
        while True:
            await asyncio.sleep(self.settings.workers.renew_seconds)
            await slots.renew(self.pool, self.owner, [assignment_id], self.lease)
