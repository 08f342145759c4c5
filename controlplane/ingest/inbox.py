"""Subscribed tickets' inboxes: what pass-through delivered (or the router forwarded), read
by workers, handed back. The writer of ``ticket_inbox`` (intake's one statement aside, which
delivers as it stores the trigger).

A worker hands back an event that is not its business. The event goes to the router only
once no other live ticket still holds it, and only if the router has something to decide
(an explicit request or a candidate to assess); otherwise it is dropped, on record.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from controlplane.db.pool import Conn, Db
from controlplane.domain import CLOSED_TICKET_SQL, Notify
from controlplane.errors import NotFound
from controlplane.ingest import routing

# An explicit "/stop" on a ticket's thread is carried out by the worker service, never
# read by the worker (see controlplane.workers.service). SQL over triggers aliased ``g``.
IS_STOP = r"(g.verdict = 'explicit' AND g.text ~* '(^|\s)/stop\M')"


@dataclass(frozen=True)
class InboxEvent:
    trigger_id: str
    thread_id: str
    source: str
    actor_name: str
    actor_is_bot: bool
    kind: str
    text: str
    created_at: datetime
    actor_id: str = ""
    person_id: str | None = None
    allowlisted: bool = False  # a human on the source's allowlist (admission.Verdict)
    public: bool | None = None  # said in public; None: not known


async def forward(conn: Conn, ticket_id: str, trigger_id: str) -> None:
    """Put an event in a ticket's inbox (the router gives it one that reached the router),
    and wake its worker."""
    await conn.execute(
        "INSERT INTO ticket_inbox (ticket_id, trigger_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        ticket_id,
        trigger_id,
    )
    await conn.execute("SELECT pg_notify($1, $2)", Notify.INBOX, f"{trigger_id}:{ticket_id}")


async def read(db: Db, ticket_id: str, limit: int = 100) -> list[InboxEvent]:
    """Take the ticket's unread events, oldest first (each is returned once). On a
    connection in a transaction, they stay unread unless that transaction commits."""
    rows = await db.fetch(
        f"""
        WITH taken AS (
            UPDATE ticket_inbox SET read_at = now()
            WHERE (ticket_id, trigger_id) IN (
                SELECT i.ticket_id, i.trigger_id FROM ticket_inbox i
                JOIN triggers g ON g.id = i.trigger_id
                WHERE i.ticket_id = $1 AND i.read_at IS NULL AND i.handed_back_at IS NULL
                  AND NOT {IS_STOP}
                ORDER BY i.created_at, i.trigger_id LIMIT $2 FOR UPDATE OF i SKIP LOCKED)
            RETURNING trigger_id
        )
        SELECT t.id, t.thread_id, t.source, t.actor_name, t.actor_is_bot, t.kind, t.text,
               t.created_at, t.actor_id, t.person_id, t.allowlisted, t.public
        FROM triggers t JOIN taken ON taken.trigger_id = t.id
        ORDER BY t.created_at, t.id
        """,
        ticket_id,
        limit,
    )
    return [
        InboxEvent(
            trigger_id=row["id"],
            thread_id=row["thread_id"],
            source=row["source"],
            actor_name=row["actor_name"],
            actor_is_bot=row["actor_is_bot"],
            kind=row["kind"],
            text=row["text"],
            created_at=row["created_at"],
            actor_id=row["actor_id"],
            person_id=row["person_id"],
            allowlisted=row["allowlisted"],
            public=row["public"],
        )
        for row in rows
    ]


async def read_all(conn: Conn, ticket_ids: list[str]) -> None:
    """Whatever the tickets' inboxes still hold is read (they ended)."""
    await conn.execute(
        "UPDATE ticket_inbox SET read_at = now() WHERE ticket_id = ANY($1::text[]) "
        "AND read_at IS NULL",
        ticket_ids,
    )


# Answers on tickets whose device wait expired, from the requester or an explicit request.
_DEVICE_ANSWERS = """
UPDATE ticket_inbox i SET read_at = now()
FROM tickets t, triggers g, mandates m
WHERE t.state = 'waiting_human' AND t.hold = 'device_expired' AND i.ticket_id = t.id
  AND i.read_at IS NULL AND i.handed_back_at IS NULL AND g.id = i.trigger_id
  AND m.ticket_id = t.id AND NOT g.actor_is_bot
  AND (g.verdict = 'explicit' OR g.actor_id = m.initiator_id)
RETURNING t.id AS ticket_id, g.id AS trigger_id, g.actor_name, g.text
"""

# "/stop" in an explicit request on a thread the ticket handles stops it (never a worker's
# business: the worker is not woken to read it).
_STOPS = f"""
UPDATE ticket_inbox i SET read_at = now()
FROM tickets t, triggers g
WHERE i.ticket_id = t.id AND g.id = i.trigger_id AND t.state NOT IN ({CLOSED_TICKET_SQL})
  AND i.read_at IS NULL AND i.handed_back_at IS NULL AND {IS_STOP}
RETURNING t.id AS ticket_id, g.id AS trigger_id, g.actor_name
"""


async def take_device_answers(db: Db) -> list[asyncpg.Record]:
    """Take the answers to tickets whose device wait expired (``device_expired``), from
    their requester or in an explicit request, for the worker service to act on. Rows:
    ticket_id, trigger_id, actor_name, text."""
    rows: list[asyncpg.Record] = await db.fetch(_DEVICE_ANSWERS)
    return rows


async def take_stops(db: Db) -> list[asyncpg.Record]:
    """Take the explicit ``/stop`` requests on live tickets' threads, for the worker service
    to carry out. Rows: ticket_id, trigger_id, actor_name."""
    rows: list[asyncpg.Record] = await db.fetch(_STOPS)
    return rows


async def hand_back(pool: asyncpg.Pool, ticket_id: str, trigger_id: str) -> str:
    """The ticket gives the event up. Returns where it is now: ``held`` (another ticket
    still has it), ``router`` or ``dropped``."""
    async with pool.acquire() as conn, conn.transaction():
        # The trigger row is locked first, so two tickets handing the same event back at
        # once agree on which of them was the last holder.
        trigger = await conn.fetchrow(
            "SELECT verdict, route FROM triggers WHERE id = $1 FOR UPDATE", trigger_id
        )
        given = await conn.fetchval(
            "UPDATE ticket_inbox SET handed_back_at = now() "
            "WHERE ticket_id = $1 AND trigger_id = $2 AND handed_back_at IS NULL "
            "RETURNING trigger_id",
            ticket_id,
            trigger_id,
        )
        if trigger is None or given is None:
            raise NotFound(f"ticket {ticket_id} does not hold {trigger_id}")
        holders = await conn.fetchval(
            "SELECT count(*) FROM ticket_inbox i JOIN tickets t ON t.id = i.ticket_id "
            "WHERE i.trigger_id = $1 AND i.handed_back_at IS NULL "
            f"AND t.state NOT IN ({CLOSED_TICKET_SQL})",
            trigger_id,
        )
        if holders:
            return "held"
        routed = trigger["verdict"] in ("explicit", "candidate")
        await routing.hand_back(conn, trigger_id, to_router=routed)
        if routed:
            await conn.execute("SELECT pg_notify($1, $2)", Notify.ROUTER, trigger_id)
        return "router" if routed else "dropped"
