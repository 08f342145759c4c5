"""One harness run, from the command that starts it to its last event: submitted to the
device, its event stream read as it arrives, recorded in the ticket's session, and watched
against the limits.

The output is the harness's own event stream (JSON lines) as the device's redactor passed
it; it is parsed by :mod:`controlplane.workers.harness.streams`. Each event the round
keeps becomes a row of the ticket's worker session (an assistant message, a tool call in
the OpenAI shape, its result), so the console shows the run live and the watchdog's checks
(:mod:`controlplane.watchdog.checks`: no progress, the same calls in circles) read a
harness like a built-in worker. ``harness_runs.events`` counts what is recorded; a replica
that takes the round over parses the output again from its start (parsing is deterministic)
and records only the events after that count.

Limits, checked as events arrive: the same tool call ``repeat_limit`` times in a row, more
turns than asked (for a harness without a turns flag), the ticket's token budget, and the
wall-clock cap. Hitting one cancels the run on the device (its whole process tree) and
says which.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import asyncpg

from controlplane.domain import LIVE_COMMAND_SQL
from controlplane.gateway import specs
from controlplane.gateway.queue import CommandQueue, CommandResult
from controlplane.llm.prices import PriceBook
from controlplane.llm.transcript import looping
from controlplane.settings import WorkerSettings
from controlplane.tickets import reports, store
from controlplane.workers.harness.streams import HarnessEvent, Tally, Usage, parser_for
from controlplane.workers.session import WorkerSession
from controlplane.workers.tools.core import Ticket
from superagent_shared.ids import new_id

log = logging.getLogger(__name__)

READ_BYTES = 256 * 1024  # output read per pass
TEXT_CHARS = 8000  # of a message or a tool result, kept in the session


@dataclass
class Run:
    """A harness run of the ticket's, as recorded."""

    id: str
    command_id: str
    harness: str
    resumed: str | None
    events: int  # recorded in the session so far
    created_at: datetime


async def live(pool: asyncpg.Pool, ticket_id: str) -> Run | None:
    """The ticket's run that has not ended, if any (a round taken over, a device back)."""
    row = await pool.fetchrow(
        "SELECT id, command_id, harness, resumed, events, created_at FROM harness_runs "
        "WHERE ticket_id = $1 AND ended_at IS NULL ORDER BY created_at DESC LIMIT 1",
        ticket_id,
    )
    return None if row is None else Run(**dict(row))


async def last_session(pool: asyncpg.Pool, ticket_id: str, harness: str) -> str | None:
    """The harness's own session id of the ticket's last run of ``harness`` (what a
    follow-up resumes), if it reported one."""
    found = await pool.fetchval(
        "SELECT session_id FROM harness_runs WHERE ticket_id = $1 AND harness = $2 "
        "AND session_id IS NOT NULL ORDER BY created_at DESC LIMIT 1",
        ticket_id,
        harness,
    )
    return None if found is None else str(found)


async def last_outcome(pool: asyncpg.Pool, ticket_id: str) -> str | None:
    found = await pool.fetchval(
        "SELECT outcome FROM harness_runs WHERE ticket_id = $1 AND outcome IS NOT NULL "
        "ORDER BY created_at DESC LIMIT 1",
        ticket_id,
    )
    return None if found is None else str(found)


async def cancel_orphans(pool: asyncpg.Pool, queue: CommandQueue, ticket_id: str) -> None:
    """Stop harness commands of the ticket that no run records (a replica died between
    submitting one and recording it): two harnesses must never edit one workspace."""
    rows = await pool.fetch(
        "SELECT c.id FROM commands c WHERE c.ticket_id = $1 AND c.kind = 'run_harness' "
        f"AND c.state IN ({LIVE_COMMAND_SQL}) AND c.cancel_requested_at IS NULL "
        "AND NOT EXISTS (SELECT 1 FROM harness_runs h WHERE h.command_id = c.id)",
        ticket_id,
    )
    for row in rows:
        log.warning("ticket %s: cancelling unrecorded harness command %s", ticket_id, row["id"])
        await queue.cancel(row["id"], grace_seconds=5)


async def start(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    ticket: Ticket,
    assignment_id: str,
    harness: str,
    prompt: str,
    resume: str | None,
    limits: WorkerSettings,
) -> Run:
    assert ticket.device_id is not None
    assert ticket.workdir
    spec = specs.RunHarness(
        harness=harness,
        cwd=ticket.workdir,
        prompt=prompt,
        resume_session=resume or "",
        max_turns=limits.harness_max_turns,
        timeout_seconds=limits.harness_timeout_seconds,
    )
    command_id = await queue.submit(
        ticket.device_id, spec, ticket_id=ticket.id, origin=f"worker {ticket.id} ({harness})"
    )
    run_id = new_id("hrn")
    created = await pool.fetchval(
        "INSERT INTO harness_runs (id, ticket_id, assignment_id, command_id, harness, resumed) "
        "VALUES ($1, $2, $3, $4, $5, $6) RETURNING created_at",
        run_id,
        ticket.id,
        assignment_id,
        command_id,
        harness,
        resume,
    )
    log.info("ticket %s: %s run %s started (%s)", ticket.id, harness, run_id, command_id)
    return Run(run_id, command_id, harness, resume, 0, created)


def message_of(event: HarnessEvent) -> dict[str, Any] | None:
    """The session row an event becomes (None: it is only counted)."""
    if event.kind == "message" and event.text:
        return {"role": "assistant", "content": event.text[:TEXT_CHARS]}
    if event.kind == "tool_call":
        arguments = json.dumps(event.arguments, ensure_ascii=False, sort_keys=True)
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": event.call_id or new_id("sup"),
                    "type": "function",
                    "function": {"name": event.tool or "tool", "arguments": arguments[:TEXT_CHARS]},
                }
            ],
        }
    if event.kind == "tool_result" and event.call_id:
        text = event.text[:TEXT_CHARS]
        return {"role": "tool", "tool_call_id": event.call_id, "content": text}
    if event.kind == "error" and event.text:
        return {"role": "assistant", "content": f"[{event.kind}] {event.text[:TEXT_CHARS]}"}
    return None


class Reader:
    """Reads a run's output from its start, feeding the parser and the tally."""

    def __init__(self, queue: CommandQueue, run: Run) -> None:
        self.queue = queue
        self.run = run
        self.parser = parser_for(run.harness)
        self.tally = Tally()
        self.offset = 0
        self.seen = 0  # events parsed so far (recorded or not)

    async def more(self, result: CommandResult) -> list[HarnessEvent]:
        """The events in output stored since the last call (all of it once ``result`` is
        final)."""
        out: list[HarnessEvent] = []
        while self.offset < result.output_size:
            data = await self.queue.output(self.run.command_id, self.offset, READ_BYTES)
            if not data:
                break
            self.offset += len(data)
            out += self.parser.feed(data)
        if result.done and self.offset >= result.output_size:
            out += self.parser.finish()
        for event in out:
            self.tally.add(event)
        self.seen += len(out)
        return out


def priced(tally: Tally, prices: PriceBook) -> Decimal | None:
    """What the run cost so far: as the harness reports it, else its tokens at the prices
    of the model it named (cache reads at the cached rate), else unknown (None)."""
    usage = tally.usage
    if usage.cost_usd is not None:
        return Decimal(str(usage.cost_usd))
    if tally.model is None:
        return None
    return prices.cost(
        tally.model, usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens
    )


async def record(
    pool: asyncpg.Pool,
    convo: WorkerSession,
    reader: Reader,
    events: list[HarnessEvent],
    ticket_id: str,
    prices: PriceBook,
) -> None:
    """Record the events not yet in the session (after ``run.events``), the run's totals,
    and the usage the ticket had not been charged yet, in one transaction."""
    run, tally = reader.run, reader.tally
    first_index = reader.seen - len(events)
    fresh = [e for i, e in enumerate(events, start=first_index) if i >= run.events]
    usage: Usage = tally.usage
    async with pool.acquire() as conn, conn.transaction():
        charged = await conn.fetchrow(
            "SELECT prompt_tokens + completion_tokens AS tokens, coalesce(cost_usd, 0) AS cost "
            "FROM harness_runs WHERE id = $1 FOR UPDATE",
            run.id,
        )
        for event in fresh:
            message = message_of(event)
            if message is not None:
                await convo.add(conn, message)
        now_events = max(run.events, reader.seen)
        cost = priced(tally, prices)
        await conn.execute(
            "UPDATE harness_runs SET events = $2, session_id = coalesce($3, session_id), "
            "turns = $4, prompt_tokens = $5, completion_tokens = $6, cost_usd = $7, "
            "first_event_at = coalesce(first_event_at, CASE WHEN $2 > 0 THEN now() END), "
            "last_event_at = CASE WHEN $8 THEN now() ELSE last_event_at END WHERE id = $1",
            run.id,
            now_events,
            tally.session_id,
            tally.turns,
            usage.prompt_tokens,
            usage.completion_tokens,
            cost,
            bool(fresh),
        )
        assert charged is not None  # the run's own row, made before it started
        tokens = max(0, usage.total - int(charged["tokens"]))
        dollars = max(Decimal(0), (cost or Decimal(0)) - Decimal(charged["cost"]))
        if tokens or dollars:
            await store.add_usage(conn, ticket_id, tokens, dollars)
    run.events = now_events


async def end(pool: asyncpg.Pool, run: Run, outcome: str) -> None:
    await pool.execute(
        "UPDATE harness_runs SET ended_at = now(), outcome = $2 WHERE id = $1 AND ended_at IS NULL",
        run.id,
        outcome[:4000],
    )


async def over_limit(
    pool: asyncpg.Pool,
    ticket_id: str,
    tally: Tally,
    limits: WorkerSettings,
    started: float,
    now: float,
) -> str | None:
    """Which limit the run has reached, if any, in words people read."""
    name = looping(tally.tool_signatures, limits.repeat_limit)
    if name is not None:
        return (
            f"limit reached: the same {name} call {limits.repeat_limit} times in a row "
            "(the harness looks stuck)"
        )
    if tally.turns > limits.harness_max_turns:
        return (
            f"limit reached: {tally.turns} turns in this harness run "
            f"(workers.harness_max_turns = {limits.harness_max_turns})"
        )
    used = await reports.spent(pool, ticket_id)
    if used.tokens >= limits.token_budget:
        return (
            f"limit reached: {used.tokens:,} tokens spent on this ticket "
            f"(workers.token_budget = {limits.token_budget:,})"
        )
    if now - started > limits.harness_timeout_seconds:
        return (
            f"limit reached: the harness ran {int(now - started)} s "
            f"(workers.harness_timeout_seconds = {limits.harness_timeout_seconds})"
        )
    return None
