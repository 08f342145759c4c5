"""Every write to ``triggers`` after intake: the router's marks, an event the tickets gave
back (:func:`hand_back`), and events the program itself puts in the router's inbox (a
worker's report).

With :mod:`controlplane.ingest.intake` (new events), the only writer of ``triggers``.
Callers hold the transaction; each function is one statement in it.
"""

from __future__ import annotations

import asyncpg

from controlplane.db.pool import Conn
from controlplane.domain import Notify
from superagent_shared.ids import new_id

# Reports from workers enter the router's inbox as events of this source and verdict.
REPORT_SOURCE = "agent"
REPORT_VERDICT = "report"


async def hand_back(conn: Conn, trigger_id: str, *, to_router: bool) -> None:
    """The last ticket that held the event gave it back: it goes to the router's inbox
    (``to_router``), or it is dropped, on record."""
    await conn.execute(
        "UPDATE triggers SET route = $2::text, "
        "routed_at = CASE WHEN $2::text = 'router' THEN NULL ELSE now() END, "
        "digested_at = now() WHERE id = $1",
        trigger_id,
        "router" if to_router else "dropped",
    )


async def mark_routed(conn: Conn, trigger_ids: list[str]) -> None:
    """Out of the router's inbox: a turn decided them."""
    await conn.execute(
        "UPDATE triggers SET routed_at = now() WHERE id = ANY($1::text[]) AND routed_at IS NULL",
        trigger_ids,
    )


async def mark_digested(conn: Conn, trigger_ids: list[str]) -> None:
    """Shown to the router once as information (a digest): not again."""
    await conn.execute(
        "UPDATE triggers SET digested_at = now() WHERE id = ANY($1::text[]) "
        "AND digested_at IS NULL",
        trigger_ids,
    )


async def count_failed_turn(conn: Conn, trigger_ids: list[str], error: str) -> list[asyncpg.Record]:
    """A turn over these failed: one more attempt each, and why. Rows (id, thread_id,
    route_attempts, verdict, text) of those still waiting to be routed."""
    rows: list[asyncpg.Record] = await conn.fetch(
        "UPDATE triggers SET route_attempts = route_attempts + 1, route_error = $2 "
        "WHERE id = ANY($1::text[]) AND routed_at IS NULL "
        "RETURNING id, thread_id, route_attempts, verdict, text",
        trigger_ids,
        error,
    )
    return rows


async def set_aside(conn: Conn, trigger_id: str) -> None:
    """Undecidable: out of the router's inbox until someone puts it back."""
    await conn.execute(
        "UPDATE triggers SET routed_at = now(), undecidable_at = now() WHERE id = $1",
        trigger_id,
    )


async def put_back(conn: Conn, trigger_id: str) -> None:
    """An undecidable event back in the router's inbox, its attempts forgotten."""
    await conn.execute(
        "UPDATE triggers SET routed_at = NULL, undecidable_at = NULL, "
        "route_attempts = 0, route_error = NULL WHERE id = $1",
        trigger_id,
    )
    await conn.execute("SELECT pg_notify($1, $2)", Notify.ROUTER, trigger_id)


async def note_model_notice(conn: Conn, thread_ids: list[str]) -> None:
    """These threads were told the model is unreachable: their waiting events need not
    say it again."""
    await conn.execute(
        "UPDATE triggers SET model_notice_at = now() WHERE routed_at IS NULL "
        "AND model_notice_at IS NULL AND thread_id = ANY($1::text[])",
        thread_ids,
    )


async def worker_report(
    conn: Conn, *, report_id: str, ticket_id: str, thread_id: str, kind: str, text: str
) -> str:
    """A worker's report as an event in the router's inbox, on the ticket's home thread;
    the router is woken. Returns the new trigger's id."""
    trigger_id = new_id("trg")
    await conn.execute(
        "INSERT INTO triggers (id, source, external_id, thread_id, actor_id, actor_name, "
        "actor_is_bot, kind, text, verdict, verdict_reason, route) "
        "VALUES ($1, $2, $3, $4, $5, $6, true, $7, $8, $9, 'a worker reported', 'router')",
        trigger_id,
        REPORT_SOURCE,
        f"report:{report_id}",
        thread_id,
        ticket_id,
        f"worker of {ticket_id}",
        kind,
        text,
        REPORT_VERDICT,
    )
    await conn.execute("SELECT pg_notify($1, $2)", Notify.ROUTER, trigger_id)
    return trigger_id
