"""One round of a ticket's worker: the asynchronous ReAct loop.

Each step shows the model what happened since its last step (events), lets it call tools,
and persists every message as it goes. The round ends when the worker reports to people
(ready, question, blocked, failed), when its device is away (the ticket waits in
``waiting_device`` and the slot is freed), or when a limit stops it. A worker whose turn
is over while background jobs run keeps its slot and waits for their events.

A call with effects outside the device made right after input without authority is held
(:mod:`controlplane.tickets.authority`): the round ends and the ticket waits in
``waiting_human`` for the requester to confirm.

Limits, on by default: model calls per round, tokens per ticket, and the same tool call
repeated ``repeat_limit`` times in a row. Hitting one stops the worker with a ``blocked``
report saying which.

A model call that fails (:mod:`controlplane.llm`, retried there when transient) ends the
round as failed (:mod:`controlplane.tickets.retries`: retried with backoff, the ticket
blocked after ``workers.failed_rounds_limit`` in a row; a bad key or an unknown model is
the deployment's, fixed by an admin while the rounds back off). A context overflow that
compacting harder and trying once more did not cure ends it ``blocked`` at once, the class
named.

Bounded context (:mod:`controlplane.workers.compaction`): before a call would fill more
than ``llm.compact_share`` of ``llm.worker_context_tokens``, old tool outputs are reduced,
then older turns summarised; the system prompt, the tools and the brief never change.

After a crash the next replica resumes the same session: calls left without a result are
answered "interrupted", and the worker is told to check the real state (working tree, git
log, the remote pull request) before repeating anything with effects outside the device.
"""

from __future__ import annotations

import asyncio
import json
import logging
import posixpath
from dataclasses import replace
from datetime import timedelta
from functools import partial
from typing import Any

import asyncpg
import openai

from controlplane import prompts
from controlplane.db.pool import Db
from controlplane.domain import TicketState
from controlplane.gateway import specs
from controlplane.gateway.queue import CommandQueue
from controlplane.llm import Accounting, Answer, ContextExceeded, LlmClient
from controlplane.llm.client import ToolCall, screen_calls
from controlplane.llm.tokens import prompt_chars
from controlplane.llm.transcript import looping
from controlplane.replies import WhileWaiting, enqueue_reply
from controlplane.settings import Settings
from controlplane.tickets import authority, events, placement, reports, slots, store
from controlplane.workers import compaction, session, workspace
from controlplane.workers.devices import AWAY_GRACE, device_gone, device_online
from controlplane.workers.harness import choice, repo_config
from controlplane.workers.tools.core import Outcome, Ticket
from controlplane.workers.tools.toolbox import TOOL_SPECS, WorkerToolbox
from superagent_shared import branches
from superagent_shared.ids import stable_id

log = logging.getLogger(__name__)

IDLE_POLL_SECONDS = 1.0  # the safety net while waiting for jobs and events
RECOVERY_NOTE = (
    "You are resuming this ticket after the control plane restarted. Before repeating "
    "anything with an effect outside the device (a push, a pull request, a message), check "
    "the real state first: the working tree (git status), the history (git log), the remote "
    "branch, and whether the pull request already exists."
)
NO_REPORT = "the worker ended its turn without a report"


class RoundOver(Exception):
    """The round ended from outside (a stop, a lost lease): leave without writing."""


async def load_ticket(db: Db, ticket_id: str) -> Ticket:
    row = await db.fetchrow(
        "SELECT t.id, t.title, t.device_id, d.name AS device_name, t.repo, "
        # Once the ticket has its workspace, that is where it works.
        "coalesce(t.workspace, t.workdir) AS workdir, t.branch, t.speculative, t.workspace, "
        "t.workspace_base FROM tickets t LEFT JOIN devices d ON d.id = t.device_id "
        "WHERE t.id = $1",
        ticket_id,
    )
    if row is None:
        raise RoundOver(f"no ticket {ticket_id}")
    return Ticket(**dict(row))


async def brief(db: Db, ticket: Ticket, given: workspace.Instructions | None = None) -> str:
    """The first message of a ticket's session: what to do, where, and on whose word."""
    mandate = await db.fetchrow(
        "SELECT m.kind, m.scope, m.initiator_name, g.id AS trigger_id, g.text, g.thread_id, "
        "th.source, th.external_id FROM mandates m LEFT JOIN triggers g ON g.id = m.trigger_id "
        "LEFT JOIN threads th ON th.id = g.thread_id WHERE m.ticket_id = $1 "
        "ORDER BY m.created_at LIMIT 1",
        ticket.id,
    )
    threads = await db.fetch(
        "SELECT thread_id FROM subscriptions WHERE ticket_id = $1 ORDER BY created_at", ticket.id
    )
    lines = [f"Ticket {ticket.id}: {ticket.title}"]
    if mandate is not None:
        lines.append(
            f"Mandate: {mandate['kind']} request by {mandate['initiator_name']}. "
            f"Scope: {mandate['scope']}"
        )
        if mandate["trigger_id"]:
            lines.append(
                f"The request ({mandate['trigger_id']} on {mandate['thread_id']}, "
                f"{mandate['source']} {mandate['external_id']}):\n{mandate['text'][:4000]}"
            )
    lines.append(f"Device: {ticket.device_name or 'none chosen'}")
    lines.append(f"Repository: {ticket.repo or 'unknown'}")
    if not ticket.in_place:
        lines.append(f"Branch: {ticket.branch} (commit and push your work there)")
    lines += workspace.brief_lines(ticket, given or workspace.Instructions())
    lines.append("Threads you handle: " + ", ".join(r["thread_id"] for r in threads))
    if ticket.speculative:
        lines.append(
            "This ticket is speculative: work quietly. Nothing is delivered unless you "
            "report ready with reproduced=true and fixed=true; anything else discards it."
        )
    return "\n".join(lines)


async def prepare_ticket(pool: asyncpg.Pool, ticket: Ticket) -> Ticket:
    """Fill in the branch (and the repository, from a GitHub thread) the first time."""
    if ticket.branch and ticket.repo:
        return ticket
    thread = await pool.fetchrow(
        "SELECT th.source, th.external_id FROM mandates m JOIN triggers g ON g.id = m.trigger_id "
        "JOIN threads th ON th.id = g.thread_id WHERE m.ticket_id = $1 LIMIT 1",
        ticket.id,
    )
    repo = ticket.repo or (
        placement.thread_repo(thread["source"], thread["external_id"]) if thread else None
    )
    branch = ticket.branch or branches.ticket_branch(ticket.id)
    await store.set_repo_branch(pool, ticket.id, repo, branch)
    return replace(ticket, repo=repo, branch=branch)


class Worker:
    """Runs one assignment to its end."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        queue: CommandQueue,
        client: openai.AsyncOpenAI,
        settings: Settings,
        assignment: slots.Assignment,
        *,
        report_to_router: bool = True,
    ) -> None:
        self.pool = pool
        self.queue = queue
        self.llm = LlmClient(pool, client, settings.llm)
        self.compactor = compaction.Compactor(self.llm, settings.llm.worker_model, settings.llm)
        self.settings = settings
        self.limits = settings.workers
        self.model = settings.llm.worker_model
        self.assignment = assignment
        self.turns = assignment.turns
        self._answered = False  # whether the model answered once in this round
        self.report_to_router = report_to_router

    async def run(self) -> str:
        """The round, to its end; returns its outcome."""
        ticket = await prepare_ticket(
            self.pool, await load_ticket(self.pool, self.assignment.ticket_id)
        )
        if ticket.device_id is not None and not await device_online(self.pool, ticket.device_id):
            return await self.await_device(ticket)
        given = workspace.Instructions()
        if workspace.wanted(ticket):
            try:
                ticket = await workspace.prepare(self.pool, self.queue, ticket)
            except workspace.Unsupported as exc:
                log.warning("ticket %s works in place: %s", ticket.id, exc)
            except workspace.Unprepared as exc:
                return await self.final(ticket, {"status": "blocked", "summary": str(exc)})
            except TimeoutError:
                assert ticket.device_id is not None  # workspace.wanted
                if not await device_online(self.pool, ticket.device_id):
                    return await self.await_device(ticket)
                raise
        backend = await self._backend(ticket)
        if backend.problem is not None:
            return await self.final(ticket, {"status": "blocked", "summary": backend.problem})
        self.compactor.fit(await self.llm.context_tokens(self.model, "worker"))
        if self.assignment.session_id is None:
            # Read for the brief, which a new session starts with.
            given = await workspace.instructions(self.queue, ticket)
        if backend.name != choice.BUILTIN:
            return await self._harness_round(ticket, backend, given)
        convo = await self._open(ticket, given)
        toolbox = WorkerToolbox(self.pool, self.queue, self.limits, ticket)
        if self.assignment.woken_by == "device":
            # Back from waiting: what was queued runs now; its results are the next events.
            await self._idle(ticket, only_while_jobs_run=True)
        while True:
            await self.still_ours()
            async with self.pool.acquire() as conn, conn.transaction():
                happened = await events.take(conn, ticket.id)
                if happened:
                    await convo.add(conn, {"role": "user", "content": happened.render()})
            if not convo.awaiting_model:
                if await events.running_jobs(self.pool, ticket.id):
                    if ticket.device_id is not None and await device_gone(
                        self.pool, ticket.device_id, AWAY_GRACE
                    ):
                        # The laptop went to sleep mid-job: wait without holding a slot.
                        return await self.await_device(ticket)
                    await self._idle(ticket)
                    continue
                last = convo.messages[-1].get("content") if convo.messages else None
                return await self.final(
                    ticket,
                    {
                        "status": "question",
                        "summary": NO_REPORT,
                        "question": str(last or "What should I do next?")[:5000],
                    },
                )
            stop = await self._limit_hit(ticket.id)
            if stop is not None:
                return await self.final(ticket, {"status": "blocked", "summary": stop})
            try:
                calls = await self._step(convo, ticket)
            except ContextExceeded as exc:
                # Compacting harder and trying once more did not help: trying again as is
                # fails again. The round ends, the class named, and people are told.
                return await self.final(
                    ticket,
                    {
                        "status": "blocked",
                        "summary": f"the model call failed ({exc.outcome}): {exc.message}"[:2000],
                    },
                )
            if not calls:
                continue
            repeated = self._repeated(convo)
            toolbox.outcome = Outcome()
            for call, refusal in screen_calls(calls):
                if repeated:
                    content: dict[str, Any] = {"error": "not run: " + repeated}
                elif refusal is not None:
                    content = {"error": refusal}
                else:
                    content = await toolbox.call(call.name, call.arguments, call.id)
                await convo.add(
                    self.pool,
                    {"role": "tool", "tool_call_id": call.id, "content": _json(content)},
                )
            if repeated:
                return await self.final(ticket, {"status": "blocked", "summary": repeated})
            if toolbox.outcome.held_by is not None:
                return await self.await_confirmation(ticket, toolbox.outcome)
            if toolbox.outcome.report is not None:
                return await self._report(ticket, toolbox)
            if toolbox.outcome.device_away:
                return await self.await_device(ticket)

    # -- who works it --------------------------------------------------------------------

    async def _backend(self, ticket: Ticket) -> choice.Backend:
        """The built-in loop, or a harness on the device (:mod:`controlplane.workers.harness`).
        A speculative ticket, or one without a workspace of its own, stays built-in: a
        harness round delivers through a branch and a pull request."""
        self.repo = repo_config.RepoConfig()
        if ticket.speculative or ticket.device_id is None or not ticket.workspace:
            return choice.Backend(choice.BUILTIN, "built-in only")
        self.repo = repo_config.parse(
            await workspace.ask_device(
                self.queue,
                ticket,
                specs.ReadFile(
                    posixpath.join(ticket.workspace, repo_config.PATH), 0, repo_config.MAX_BYTES
                ),
            )
        )
        if self.repo.problem:
            log.warning("ticket %s: %s", ticket.id, self.repo.problem)
        return await choice.choose(
            self.pool, ticket.id, ticket.device_id, ticket.device_name or "", self.repo
        )

    async def _harness_round(
        self, ticket: Ticket, backend: choice.Backend, given: workspace.Instructions
    ) -> str:
        from controlplane.workers.harness.rounds import HarnessRound

        convo = await self._open(ticket, given, harness=backend.name)
        text = await brief(self.pool, ticket, given)
        log.info("ticket %s: worked by %s (%s)", ticket.id, backend.name, backend.why)
        return await HarnessRound(self, ticket, backend, self.repo, text).run(convo)

    # -- the session ---------------------------------------------------------------------

    async def _open(
        self, ticket: Ticket, given: workspace.Instructions, *, harness: str | None = None
    ) -> session.WorkerSession:
        """The round's session: a new one starts with the brief. A harness's session
        records its runs, each starting with the instruction the harness was given (the
        brief is in the first), and nothing in it is shown to a model here."""
        model = f"harness:{harness}" if harness else self.model
        async with self.pool.acquire() as conn, conn.transaction():
            convo, new = await session.WorkerSession.open(
                conn, self.assignment.session_id, ticket_id=ticket.id, model=model
            )
            if new:
                await slots.set_session(conn, self.assignment.id, convo.id)
                if harness is None:
                    await convo.add(
                        conn, {"role": "user", "content": await brief(conn, ticket, given)}
                    )
            elif harness is None and (self.assignment.taken_over or convo.unanswered_calls()):
                await convo.close_interrupted(conn)
                await convo.add(conn, {"role": "user", "content": RECOVERY_NOTE})
        return convo

    async def _system_prompt(self) -> tuple[str | None, str]:
        """The worker prompt's current version (id and text); the built-in one until saved."""
        row = await self.pool.fetchrow(
            "SELECT id, body FROM prompt_versions WHERE name = 'worker' "
            "ORDER BY version DESC LIMIT 1"
        )
        return (row["id"], row["body"]) if row else (None, prompts.DEFAULTS["worker"])

    async def _step(self, convo: session.WorkerSession, ticket: Ticket) -> tuple[ToolCall, ...]:
        """One model call; its answer is persisted before any of its tool calls runs.

        The context is compacted first if the call would not fit its share of the window
        (:mod:`controlplane.workers.compaction`); a call the provider refuses as too long is
        compacted harder and made once more. Raises the call's :class:`LlmError` (already on
        record in ``llm_calls``).
        """
        prompt_version, system = await self._system_prompt()
        head = {"role": "system", "content": system}
        accounting = Accounting(
            convo.id,
            ticket_id=ticket.id,
            prompt_version_id=prompt_version,
        )
        compact = partial(
            self.compactor.compact,
            self.pool,
            convo,
            system=head,
            tools=TOOL_SPECS,
            accounting=accounting,
            ticket_id=ticket.id,
        )
        await compact()
        try:
            answer = await self._call(convo, head, accounting)
        except ContextExceeded:
            if await compact(force=True) is None:
                raise  # nothing left to compact: the same call would fail the same way
            answer = await self._call(convo, head, accounting)
        self.turns += 1
        async with self.pool.acquire() as conn, conn.transaction():
            await convo.add(conn, answer.message())
            await slots.count_turns(conn, self.assignment.id, self.turns)
            if not self._answered:
                # The model answered: the failures in a row that block a ticket start over
                # (once a round: a round that got this far is not failing in a row).
                await store.fresh_tries(conn, ticket.id)
        self._answered = True
        return answer.tool_calls

    async def _call(
        self, convo: session.WorkerSession, head: dict[str, Any], accounting: Accounting
    ) -> Answer:
        messages = [head, *convo.context()]
        answer = await self.llm.complete(
            model=self.model,
            messages=messages,
            tools=TOOL_SPECS,
            accounting=accounting,
            max_tokens=self.llm.settings.worker_max_tokens,
        )
        self.compactor.budget.learn(prompt_chars(messages, TOOL_SPECS), answer.usage.prompt_tokens)
        return answer

    # -- limits --------------------------------------------------------------------------

    async def _limit_hit(self, ticket_id: str) -> str | None:
        if self.turns >= self.limits.max_turns:
            return (
                f"limit reached: {self.turns} model calls in this round "
                f"(workers.max_turns = {self.limits.max_turns})"
            )
        used = await reports.spent(self.pool, ticket_id)
        if used.tokens >= self.limits.token_budget:
            return (
                f"limit reached: {used.tokens:,} tokens spent on this ticket "
                f"(workers.token_budget = {self.limits.token_budget:,})"
            )
        return None

    def _repeated(self, convo: session.WorkerSession) -> str | None:
        name = looping(convo.recent_calls(), self.limits.repeat_limit)
        if name is not None:
            return (
                f"limit reached: the same {name} call {self.limits.repeat_limit} times in a row "
                "(the worker looks stuck)"
            )
        return None

    # -- ends ----------------------------------------------------------------------------

    async def still_ours(self) -> None:
        active = await self.pool.fetchval(
            "SELECT a.ended_at IS NULL AND t.state = 'running' FROM assignments a "
            "JOIN tickets t ON t.id = a.ticket_id WHERE a.id = $1",
            self.assignment.id,
        )
        if not active:
            raise RoundOver(f"{self.assignment.id} ended from outside")

    async def _idle(self, ticket: Ticket, *, only_while_jobs_run: bool = False) -> None:
        """Turn over, jobs running: keep the slot, wait for an event (or the device to go)."""
        ticket_id = ticket.id
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30.0  # come back now and then to check the round is ours
        while loop.time() < deadline:
            if await events.has_pending(self.pool, ticket_id):
                return
            if ticket.device_id is not None and await device_gone(
                self.pool, ticket.device_id, AWAY_GRACE
            ):
                return
            running = await events.running_jobs(self.pool, ticket_id)
            if only_while_jobs_run and not running:
                return
            if running:  # woken by the job's done notification, or the poll
                await self.queue.wait(running[0], IDLE_POLL_SECONDS)
            else:
                await asyncio.sleep(IDLE_POLL_SECONDS)

    async def _report(self, ticket: Ticket, toolbox: WorkerToolbox) -> str:
        report = toolbox.outcome.report
        assert report is not None
        return await self.final(ticket, report)

    async def final(self, ticket: Ticket, report: dict[str, Any]) -> str:
        state = await reports.finish(
            self.pool, ticket.id, self.assignment.id, report, to_router=self.report_to_router
        )
        log.info("worker %s: %s, ticket now %s", ticket.id, report["status"], state)
        return str(report["status"])

    async def await_confirmation(self, ticket: Ticket, outcome: Outcome) -> str:
        """A call was held for lack of authority: free the slot, wait for people, ask once."""
        assert outcome.held_by is not None
        async with self.pool.acquire() as conn, conn.transaction():
            await authority.wait_for_confirmation(
                conn, ticket.id, self.assignment.id, outcome.held, outcome.held_by
            )
        log.info("worker %s: %s held after %s", ticket.id, outcome.held, outcome.held_by)
        return authority.HOLD

    async def await_device(self, ticket: Ticket) -> str:
        """The device is away: free the slot, wait in waiting_device, and tell the thread
        once, if it is still away after ``workers.device_notice_seconds``."""
        wait = timedelta(seconds=self.limits.device_wait_seconds)
        async with self.pool.acquire() as conn, conn.transaction():
            until = await store.wait_for_device(conn, ticket.id, wait, if_running=True)
            await slots.end(conn, self.assignment.id, "waiting_device")
            thread = await reports.home_thread(conn, ticket.id)
            if until is not None and thread is not None:
                await enqueue_reply(
                    conn,
                    thread,
                    f"{ticket.id} is waiting for the device {ticket.device_name}, which is "
                    "offline. Its work stays queued and resumes by itself when the device "
                    f"reconnects. If it has not by {until:%Y-%m-%d %H:%M} UTC, I will ask here "
                    "whether to move the work to another device or drop it.",
                    stable_id("msg", f"waiting_device:{self.assignment.id}"),
                    # A link cut or a laptop lid closed for a moment is nobody's news: the
                    # thread hears only if the ticket still waits after the grace.
                    delay=self.limits.device_notice_seconds,
                    only_while=WhileWaiting(ticket.id, TicketState.WAITING_DEVICE, until),
                )
        log.info("worker %s: device %s away; waiting", ticket.id, ticket.device_name)
        return "waiting_device"


def _json(content: dict[str, Any]) -> str:
    return json.dumps(content, ensure_ascii=False, default=str)
