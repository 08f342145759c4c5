"""A worker's inbox: what happened since it last looked, as one message.

Three kinds of event, all durable in Postgres:

* channel events passed through to the ticket (``ticket_inbox``): follow-ups, CI results,
  review comments;
* background jobs that finished (``jobs`` whose command is final and not yet reported);
* worker events (``worker_events``): a retry, a reroute, a pull request opened.

:func:`take` runs inside the transaction that appends the message to the session, so an
event is marked read only together with the message that shows it to the model.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.db.pool import Conn, Db
from controlplane.gateway.queue import TERMINAL, CommandResult
from controlplane.ingest import inbox
from controlplane.workers import output
from superagent_shared.ids import new_id

_TERMINAL = list(TERMINAL)
TEXT_LIMIT = 4000  # characters of a channel event shown inline (recall for the rest)


@dataclass(frozen=True)
class Events:
    lines: list[str]
    human: bool  # a person (not a bot) wrote something

    def __bool__(self) -> bool:
        return bool(self.lines)

    def render(self) -> str:
        return "Events since your last step:\n" + "\n\n".join(self.lines)


async def take(conn: Conn, ticket_id: str) -> Events:
    lines: list[str] = []
    human = False
    for event in await inbox.read(conn, ticket_id):
        human = human or not event.actor_is_bot
        text = event.text
        if len(text) > TEXT_LIMIT:
            text = (
                text[:TEXT_LIMIT]
                + f" …(+{len(text) - TEXT_LIMIT} chars: recall {event.trigger_id})"
            )
        who = event.actor_name + (" (bot)" if event.actor_is_bot else "")
        lines.append(
            f"[{event.trigger_id}] {event.kind} on {event.thread_id} ({event.source}) from "
            f"{who}: {text}"
        )
    rows = await conn.fetch(
        "UPDATE jobs j SET reported_at = now() FROM commands c "
        "WHERE j.ticket_id = $1 AND j.background AND j.reported_at IS NULL "
        "AND c.id = j.command_id AND c.state = ANY($2::text[]) "
        "RETURNING j.script, c.id, c.device_id, c.kind, c.state, c.exit_code, c.signal, c.error, "
        "c.refusal_reason, c.timed_out, c.output_truncated, c.output_size, c.output_head, "
        "c.output_tail, c.output_blob_id, c.approval_rule, c.approval_deadline",
        ticket_id,
        _TERMINAL,
    )
    for row in rows:
        result = CommandResult.from_row(row)
        described = output.describe(result)
        body = "\n".join(f"  {key}: {value}" for key, value in described.items())
        lines.append(f"Job {result.id} ({row['script'][:200]}) ended:\n{body}")
    for row in await conn.fetch(
        "UPDATE worker_events SET read_at = now() WHERE ticket_id = $1 AND read_at IS NULL "
        "RETURNING kind, text, created_at",
        ticket_id,
    ):
        lines.append(f"{row['kind']}: {row['text']}")
    return Events(lines, human)


async def add(db: Db, ticket_id: str, kind: str, text: str) -> None:
    """A worker event; it wakes the ticket's worker if it waits for people."""
    await db.execute(
        "INSERT INTO worker_events (id, ticket_id, kind, text) VALUES ($1, $2, $3, $4)",
        new_id("wev"),
        ticket_id,
        kind,
        text,
    )


async def running_jobs(db: Db, ticket_id: str) -> list[str]:
    """Background jobs of the ticket not yet final (the worker keeps its slot for them)."""
    rows = await db.fetch(
        "SELECT j.command_id FROM jobs j JOIN commands c ON c.id = j.command_id "
        "WHERE j.ticket_id = $1 AND j.background AND j.reported_at IS NULL "
        "AND c.state <> ALL($2::text[]) ORDER BY c.seq",
        ticket_id,
        _TERMINAL,
    )
    return [row["command_id"] for row in rows]


async def has_pending(db: Db, ticket_id: str) -> bool:
    """Whether :func:`take` would find something (without taking it)."""
    found = await db.fetchval(
        "SELECT EXISTS (SELECT 1 FROM ticket_inbox WHERE ticket_id = $1 AND read_at IS NULL "
        "               AND handed_back_at IS NULL) "
        "OR EXISTS (SELECT 1 FROM jobs j JOIN commands c ON c.id = j.command_id "
        "           WHERE j.ticket_id = $1 AND j.background AND j.reported_at IS NULL "
        "           AND c.state = ANY($2::text[])) "
        "OR EXISTS (SELECT 1 FROM worker_events WHERE ticket_id = $1 AND read_at IS NULL)",
        ticket_id,
        _TERMINAL,
    )
    return bool(found)
