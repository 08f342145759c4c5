"""Which threads a ticket handles (``subscriptions``: their events go to its worker) and
which it is only related to (``links``: context, nothing delivered). The only writer of
both tables.
"""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.db.pool import Conn, Db


async def subscribe_all(conn: Conn, ticket_id: str, thread_ids: Sequence[str]) -> None:
    """A new ticket's threads (none of them subscribed yet)."""
    await conn.execute(
        "INSERT INTO subscriptions (thread_id, ticket_id) SELECT unnest($1::text[]), $2",
        list(thread_ids),
        ticket_id,
    )


async def subscribe(db: Db, ticket_id: str, thread_id: str) -> None:
    """The thread's events go to the ticket from now on (a second time changes nothing)."""
    await db.execute(
        "INSERT INTO subscriptions (thread_id, ticket_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        thread_id,
        ticket_id,
    )


async def unsubscribe(db: Db, ticket_id: str, thread_id: str) -> None:
    await db.execute(
        "DELETE FROM subscriptions WHERE thread_id = $1 AND ticket_id = $2", thread_id, ticket_id
    )


async def unsubscribe_all(conn: Conn, ticket_id: str) -> None:
    """The ticket handles no thread any more."""
    await conn.execute("DELETE FROM subscriptions WHERE ticket_id = $1", ticket_id)


async def link(db: Db, ticket_id: str, thread_id: str) -> None:
    """The thread is related to the ticket (context only)."""
    await db.execute(
        "INSERT INTO links (thread_id, ticket_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        thread_id,
        ticket_id,
    )
