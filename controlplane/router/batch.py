"""A router turn's input: everything queued since the last turn, rendered Inline & Spill.

*Inline & Spill*: the model sees every event of the batch with its ID, who sent it and the
verdict, the first ~200 characters of its text, and the nearest context: the message it
replied to and its neighbours on the same thread, as short snippets. Everything else
(longer texts, older messages, tickets) stays behind IDs that ``recall`` opens.

Pass-through events (already delivered to subscribed tickets) cause no turn. The next
turn still lists them, one line each, as a digest.

Isolation. A trigger whose earlier turn failed (``route_attempts > 0``) is taken alone,
oldest first, before anything else: a poison event in a batch costs the others one failed
turn, then each is decided (or, the poison, set aside) in a turn of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from controlplane.domain import CLOSED_TICKET_SQL
from controlplane.ingest import routing

SNIPPET = 200  # characters of an event's text shown inline
NEIGHBOURS = 2  # earlier messages of the same thread shown as context
MAX_BATCH = 200  # events per turn; the rest wait for the next one
MAX_DIGEST = 50


@dataclass(frozen=True)
class Event:
    id: str
    source: str
    thread_id: str
    thread_title: str | None
    actor_name: str
    actor_is_bot: bool
    kind: str
    text: str
    verdict: str
    created_at: datetime
    person: str | None = None  # the linked person behind the account, if any
    tickets: list[str] | None = None  # live tickets handling the event's thread


@dataclass(frozen=True)
class Context:
    """An earlier message on an event's thread, shown as a snippet."""

    id: str
    thread_id: str
    actor_name: str
    text: str


@dataclass(frozen=True)
class Batch:
    events: list[Event]
    context: dict[str, list[Context]]  # by thread id, oldest first
    digest: list[Event]  # pass-through events since the last turn
    isolated: bool = False  # a trigger whose earlier turn failed, taken alone

    @property
    def trigger_ids(self) -> list[str]:
        return [event.id for event in self.events]

    def __bool__(self) -> bool:
        return bool(self.events)


_EVENT_COLUMNS = (
    "t.id, t.source, t.thread_id, th.title AS thread_title, t.actor_name, t.actor_is_bot, "
    "t.kind, t.text, t.verdict, t.created_at, "
    "(SELECT name FROM people p WHERE p.id = t.person_id) AS person, "
    "(SELECT array_agg(s.ticket_id ORDER BY s.ticket_id) FROM subscriptions s "
    f" JOIN tickets k ON k.id = s.ticket_id WHERE s.thread_id = t.thread_id "
    f" AND k.state NOT IN ({CLOSED_TICKET_SQL})) AS tickets"
)


def _event(row: asyncpg.Record) -> Event:
    return Event(**dict(row))


async def take(pool: asyncpg.Pool, limit: int = MAX_BATCH) -> Batch:
    """What waits for the router (not yet marked; see :func:`mark_routed`).

    The oldest trigger whose earlier turn failed comes alone, without a digest (so that
    a failure can only be its own); otherwise everything waiting, up to ``limit``.
    """
    retried = await pool.fetch(
        f"SELECT {_EVENT_COLUMNS} FROM triggers t JOIN threads th ON th.id = t.thread_id "
        "WHERE t.routed_at IS NULL AND t.route_attempts > 0 "
        "ORDER BY t.created_at, t.id LIMIT 1"
    )
    isolated = bool(retried)
    if isolated:
        rows = retried
    else:
        rows = await pool.fetch(
            f"SELECT {_EVENT_COLUMNS} FROM triggers t JOIN threads th ON th.id = t.thread_id "
            "WHERE t.routed_at IS NULL ORDER BY t.created_at, t.id LIMIT $1",
            limit,
        )
    events = [_event(row) for row in rows]
    digest = (
        []
        if isolated
        else [
            _event(row)
            for row in await pool.fetch(
                f"SELECT {_EVENT_COLUMNS} FROM triggers t "
                "JOIN threads th ON th.id = t.thread_id "
                "WHERE t.route = 'subscribers' AND t.digested_at IS NULL "
                "ORDER BY t.created_at, t.id LIMIT $1",
                MAX_DIGEST,
            )
        ]
    )
    context: dict[str, list[Context]] = {}
    if events:
        first_seen: dict[str, tuple[datetime, str]] = {}
        for event in events:
            first_seen.setdefault(event.thread_id, (event.created_at, event.id))
        rows = await pool.fetch(
            """
            SELECT c.id, c.thread_id, c.actor_name, c.text
            FROM unnest($1::text[], $2::timestamptz[], $3::text[]) AS f(thread_id, at, id)
            CROSS JOIN LATERAL (
                SELECT id, thread_id, actor_name, text, created_at FROM triggers
                WHERE thread_id = f.thread_id AND (created_at, id) < (f.at, f.id)
                ORDER BY created_at DESC, id DESC LIMIT $4
            ) c
            ORDER BY c.created_at, c.id
            """,
            list(first_seen),
            [at for at, _ in first_seen.values()],
            [first for _, first in first_seen.values()],
            NEIGHBOURS,
        )
        for row in rows:
            context.setdefault(row["thread_id"], []).append(Context(**dict(row)))
    return Batch(events, context, digest, isolated)


def _snippet(text: str, limit: int = SNIPPET) -> tuple[str, int]:
    """The first ``limit`` characters on one line, and how many more there are."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat, 0
    return flat[:limit], len(flat) - limit


def render(batch: Batch) -> str:
    """The batch as the model reads it (deterministic: same batch, same text)."""
    lines = [f"{len(batch.events)} new event(s). Decide on each; act through the tools."]
    shown_threads: set[str] = set()
    for event in batch.events:
        if event.thread_id not in shown_threads:
            shown_threads.add(event.thread_id)
            title = f' "{event.thread_title}"' if event.thread_title else ""
            handled = f" handled by {', '.join(event.tickets)}" if event.tickets else ""
            lines.append("")
            lines.append(f"thread {event.thread_id} ({event.source}){title}{handled}")
            for earlier in batch.context.get(event.thread_id, []):
                text, more = _snippet(earlier.text, SNIPPET // 2)
                tail = f" …(+{more})" if more else ""
                lines.append(f"  earlier {earlier.id} {earlier.actor_name}: {text}{tail}")
        text, more = _snippet(event.text)
        tail = f" …(+{more} chars: recall {event.id})" if more else ""
        bot = " (bot)" if event.actor_is_bot else ""
        if event.person is not None and event.person != event.actor_name:
            bot += f" (person {event.person})"
        lines.append(
            f"  [{event.id}] {event.verdict} {event.kind} from {event.actor_name}{bot} "
            f"at {event.created_at:%Y-%m-%d %H:%M:%S}Z: {text}{tail}"
        )
    if batch.digest:
        lines.append("")
        lines.append("Delivered to subscribed tickets since the last turn (no action needed):")
        for event in batch.digest:
            text, more = _snippet(event.text, 80)
            lines.append(
                f"  {event.id} on {event.thread_id} from {event.actor_name}: "
                f"{text}{' …' if more else ''}"
            )
    return "\n".join(lines)


async def mark_routed(pool: asyncpg.Pool, batch: Batch, decided: list[str] | None = None) -> None:
    """The turn is done with these (``decided``, or the whole batch): out of the router's
    inbox, digest delivered."""
    async with pool.acquire() as conn, conn.transaction():
        await routing.mark_routed(conn, batch.trigger_ids if decided is None else decided)
        await routing.mark_digested(conn, [event.id for event in batch.digest])
