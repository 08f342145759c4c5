"""What people (and the router) can do to a ticket from outside: stop, retry, reroute.

Each is one transaction; the round that was running notices at its next step (its
assignment ended) and leaves without writing, and its lease is not renewed.
"""

from __future__ import annotations

from datetime import timedelta

import asyncpg

from controlplane.db.pool import Conn
from controlplane.errors import InvalidInput, NotFound
from controlplane.gateway.queue import CommandQueue
from controlplane.ingest.intake import CLOSED_TICKET_STATES, WORKERS_CHANNEL
from controlplane.workers import events, slots


async def _state(conn: Conn, ticket_id: str) -> str:
    state = await conn.fetchval("SELECT state FROM tickets WHERE id = $1 FOR UPDATE", ticket_id)
    if state is None:
        raise NotFound(f"no ticket {ticket_id}")
    return str(state)


async def stop(conn: Conn, ticket_id: str, *, by: str) -> str:
    """Stop the ticket for good: mandate revoked, round ended; its device work is cancelled
    after commit (:func:`cancel_stopped`). Returns the state it was in."""
    state = await _state(conn, ticket_id)
    if state in CLOSED_TICKET_STATES:
        return state
    await conn.execute(
        "UPDATE tickets SET state = 'stopped', hold = $2, updated_at = now() WHERE id = $1",
        ticket_id,
        f"stopped by {by}"[:50],
    )
    await conn.execute(
        "UPDATE mandates SET revoked_at = now() WHERE ticket_id = $1 AND revoked_at IS NULL",
        ticket_id,
    )
    active = await conn.fetchval(
        "SELECT id FROM assignments WHERE ticket_id = $1 AND ended_at IS NULL", ticket_id
    )
    if active is not None:
        await slots.end(conn, active, "stopped")
    await conn.execute("SELECT pg_notify($1, $2)", WORKERS_CHANNEL, ticket_id)
    return state


async def retry(pool: asyncpg.Pool, ticket_id: str, *, by: str, note: str = "") -> None:
    """Wake a worker that waits for people (after blocked, failed, or a question)."""
    async with pool.acquire() as conn, conn.transaction():
        state = await _state(conn, ticket_id)
        if state != "waiting_human":
            raise InvalidInput(f"{ticket_id} is {state}; only a ticket waiting for people retries")
        await events.add(conn, ticket_id, "retry", f"{by} asks you to try again. {note}".strip())


async def reroute(
    pool: asyncpg.Pool,
    ticket_id: str,
    device: str,
    *,
    by: str,
    wait: timedelta,
) -> str:
    """Move the ticket to another device; what was queued for the old one is cancelled.
    The worker resumes once the new device is connected. Returns the device's name."""
    async with pool.acquire() as conn, conn.transaction():
        state = await _state(conn, ticket_id)
        if state in CLOSED_TICKET_STATES:
            raise InvalidInput(f"{ticket_id} is {state}")
        found = await conn.fetchrow(
            "SELECT id, name FROM devices WHERE (id = $1 OR name = $1) AND revoked_at IS NULL",
            device,
        )
        if found is None:
            raise NotFound(f"no paired device {device!r}")
        active = await conn.fetchval(
            "SELECT id FROM assignments WHERE ticket_id = $1 AND ended_at IS NULL", ticket_id
        )
        if active is not None:
            await slots.end(conn, active, "rerouted")
        await conn.execute(
            "UPDATE tickets SET device_id = $2, state = 'waiting_device', hold = 'device', "
            "wait_until = now() + $3::interval, updated_at = now() WHERE id = $1",
            ticket_id,
            found["id"],
            wait,
        )
        await events.add(
            conn,
            ticket_id,
            "rerouted",
            f"{by} moved this ticket to the device {found['name']}. Work queued for the old "
            "device was cancelled: check what exists on this one before going on.",
        )
        # What was queued for the old device must not run there later.
        await conn.execute(
            "UPDATE commands SET state = 'cancelled', cancel_requested_at = now(), "
            "finished_at = now(), error = 'the ticket moved to another device' "
            "WHERE ticket_id = $1 AND device_id <> $2 AND state = 'queued'",
            ticket_id,
            found["id"],
        )
    return str(found["name"])


async def cancel_stopped(pool: asyncpg.Pool, queue: CommandQueue) -> int:
    """Cancel device work that stopped tickets still have queued or running (done by the
    worker service after the stop committed, so a crash in between loses nothing)."""
    rows = await pool.fetch(
        "SELECT c.id FROM commands c JOIN tickets t ON t.id = c.ticket_id "
        "WHERE t.state = 'stopped' AND c.kind <> 'cancel' AND c.cancel_requested_at IS NULL "
        "AND c.state IN ('queued', 'delivered', 'awaiting_approval', 'running') LIMIT 100"
    )
    for row in rows:
        await queue.cancel(row["id"], grace_seconds=5)
    return len(rows)
