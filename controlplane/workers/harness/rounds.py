"""A round of a ticket worked by a harness: a coding-agent CLI on the ticket's device.

The round is thin. It composes the harness's instruction (:mod:`.instruction`), starts
it in the ticket's workspace as a device command (:mod:`.runs`: the device builds the
program's argv and credentials from its own table and policy, confines it like any
command, and streams its events), records the run in the ticket's session as it goes, and
stops it at a limit. When the run ends it checks the workspace (:mod:`.finish`: the
repository's tests, the diff), commits and pushes what the harness left, opens or updates
the pull request through the worker's own tools (so the same holds for input without
authority apply), and reports through the normal report path: people hear the router.

Follow-ups resume the harness's own session (``resume`` by its session id) when it reported
one; otherwise a new session starts with the brief and what the earlier run ended with.
People's events that arrive while it runs wait for the run's end, then resume it once
more; a watchdog nudge interrupts the run and resumes it with the nudge. Stopping the
ticket cancels the command, which kills the harness's process tree on the device.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from controlplane.domain import CommandState
from controlplane.gateway.queue import CommandResult
from controlplane.tickets import events
from controlplane.workers import session
from controlplane.workers.devices import AWAY_GRACE, device_gone
from controlplane.workers.harness import finish, instruction, runs
from controlplane.workers.harness.choice import Backend
from controlplane.workers.harness.repo_config import RepoConfig
from controlplane.workers.tools.core import Ticket
from controlplane.workers.tools.toolbox import WorkerToolbox

if TYPE_CHECKING:
    from controlplane.workers.worker import Worker

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0
MAX_RUNS_PER_ROUND = 4  # follow-ups and test fixes within one round, before reporting
WATCHDOG = "watchdog"


class HarnessRound:
    def __init__(
        self, worker: Worker, ticket: Ticket, backend: Backend, config: RepoConfig, brief: str
    ) -> None:
        self.worker = worker
        self.pool = worker.pool
        self.queue = worker.queue
        self.limits = worker.limits
        self.ticket = ticket
        self.harness = backend.name
        self.config = config
        self.brief = brief
        self.toolbox = WorkerToolbox(self.pool, self.queue, self.limits, ticket)
        self.next_note: str | None = None  # for the next run's instruction (failed tests)

    async def run(self, convo: session.WorkerSession) -> str:
        ticket = self.ticket
        await runs.cancel_orphans(self.pool, self.queue, ticket.id)
        run = await runs.live(self.pool, ticket.id)
        fixes = 0
        for _ in range(MAX_RUNS_PER_ROUND):
            if run is None:
                run = await self._start(convo)
            ended = await self._follow(convo, run)
            if isinstance(ended, str):
                return ended  # the device went away, or a limit: the round is over
            if ended is None:
                run = None  # interrupted by the watchdog: resume with what it said
                continue
            result, reader = ended
            if not result.ok:
                return await self._failed(run, result, reader)
            await runs.end(self.pool, run, reader.tally.result_text or reader.tally.last_message)
            run = None
            if await events.has_pending(self.pool, ticket.id):
                continue  # people said more while it worked: resume with it first
            checked = await finish.check_tests(self, convo)
            if checked is not None and fixes < self.limits.harness_fix_rounds:
                fixes += 1
                self.next_note = instruction.tests_failed(self.config.test or "", checked)
                continue
            if checked is not None:
                return await self._report(
                    {
                        "status": "blocked",
                        "summary": "the repository's tests still fail "
                        f"after the harness's work:\n{checked}"[:5000],
                    }
                )
            return await finish.deliver(self, convo, reader.tally)
        return await self._report(
            {
                "status": "question",
                "summary": f"{MAX_RUNS_PER_ROUND} harness runs in this round without an end "
                "(follow-ups kept arriving); what should happen next?",
                "question": "Should I go on?",
            }
        )

    # -- starting and following a run ----------------------------------------------------

    async def _start(self, convo: session.WorkerSession) -> runs.Run:
        ticket = self.ticket
        resume = await runs.last_session(self.pool, ticket.id, self.harness)
        async with self.pool.acquire() as conn, conn.transaction():
            happened = await events.take(conn, ticket.id)
            rendered = happened.render() if happened else None
            note, self.next_note = self.next_note, None
            if resume:
                prompt = instruction.follow_up(ticket, rendered, note)
            elif await conn.fetchval(
                "SELECT 1 FROM harness_runs WHERE ticket_id = $1 LIMIT 1", ticket.id
            ):
                previous = await runs.last_outcome(self.pool, ticket.id)
                prompt = instruction.fresh_after(self.brief, ticket, previous, rendered)
            else:
                prompt = instruction.first(self.brief, ticket, rendered)
            await convo.add(conn, {"role": "user", "content": prompt})
        return await runs.start(
            self.pool,
            self.queue,
            ticket,
            self.worker.assignment.id,
            self.harness,
            prompt,
            resume,
            self.limits,
        )

    async def _follow(
        self, convo: session.WorkerSession, run: runs.Run
    ) -> tuple[CommandResult, runs.Reader] | str | None:
        """Read the run to its end; a str when the round ends first (device away, limit),
        None when the watchdog interrupted it."""
        ticket = self.ticket
        reader = runs.Reader(self.queue, run)
        loop = asyncio.get_running_loop()
        started = loop.time() - max(
            0.0, (await self.pool.fetchval("SELECT now()") - run.created_at).total_seconds()
        )
        while True:
            await self.worker.still_ours()
            result = await self.queue.wait(run.command_id, POLL_SECONDS)
            fresh = await reader.more(result)
            if fresh or result.done:
                await runs.record(
                    self.pool, convo, reader, fresh, ticket.id, self.worker.llm.prices
                )
            if result.done:
                return result, reader
            limit = await runs.over_limit(
                self.pool, ticket.id, reader.tally, self.limits, started, loop.time()
            )
            if limit is not None:
                await self.queue.cancel(run.command_id, grace_seconds=5)
                await runs.end(self.pool, run, limit)
                return await self._report({"status": "blocked", "summary": limit})
            if await self._nudged():
                # The watchdog spoke: stop this run, resume it with what it said.
                await self.queue.cancel(run.command_id, grace_seconds=5)
                await self.queue.wait(run.command_id, 30.0)
                await runs.end(self.pool, run, "interrupted by the watchdog")
                return None
            assert ticket.device_id is not None
            if await device_gone(self.pool, ticket.device_id, AWAY_GRACE):
                # The laptop went to sleep mid-run: wait without holding a slot; the round
                # that starts when it is back follows the same run (runs.live).
                return await self.worker.await_device(ticket)

    async def _nudged(self) -> bool:
        found = await self.pool.fetchval(
            "SELECT 1 FROM worker_events WHERE ticket_id = $1 AND kind = $2 AND read_at IS NULL",
            self.ticket.id,
            WATCHDOG,
        )
        return bool(found)

    async def _failed(self, run: runs.Run, result: CommandResult, reader: runs.Reader) -> str:
        """The run did not finish well: refused by the device, timed out, or the harness
        failed. Says which, in one line people can act on."""
        # A stop cancels the run: that is the stop's doing, not a failure to report.
        await self.worker.still_ours()
        tally = reader.tally
        if result.state == CommandState.REFUSED:
            why = (
                f"the device refused to run {self.harness}: {result.error or result.refusal_reason}"
            )
            await runs.end(self.pool, run, why)
            return await self._report({"status": "blocked", "summary": why})
        if result.timed_out:
            why = (
                f"{self.harness} ran past its wall-clock cap "
                f"(workers.harness_timeout_seconds = {self.limits.harness_timeout_seconds}, or "
                "the device's policy maximum) and was stopped"
            )
            await runs.end(self.pool, run, why)
            return await self._report({"status": "blocked", "summary": why})
        detail = tally.error or tally.result_text or result.error or ""
        why = (
            f"{self.harness} ended without success ({result.state}, exit code "
            f"{result.exit_code}{', signal ' + str(result.signal) if result.signal else ''})"
            + (f": {detail[:1500]}" if detail else "")
        )
        await runs.end(self.pool, run, why)
        return await self._report({"status": "failed", "summary": why})

    async def _report(self, report: dict[str, Any]) -> str:
        return await self.worker.final(self.ticket, report)
