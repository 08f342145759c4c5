"""What people (and the router) can do to a ticket from outside: stop, retry, reroute.

Each is one transaction; the round that was running notices at its next step (its
assignment ended) and leaves without writing, and its lease is not renewed.

A reroute is checked like any choice of device (controlplane.gateway.authorization): the new device
must be the ticket's requester's, shared with them, or directed to by its owner (the CLI and
the console act as the admin, ``web:admin``); otherwise the ticket waits for the owner's
approval, and nothing runs there before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import asyncpg

from controlplane.db.pool import Conn
from controlplane.domain import CLOSED_TICKET_STATES, LIVE_COMMAND_SQL, Notify, TicketState
from controlplane.errors import InvalidInput, NotFound
from controlplane.gateway import authorization as access
from controlplane.gateway import queue as commands
from controlplane.gateway.queue import CommandQueue
from controlplane.tickets import device_grant, events, mandates, slots, store
from controlplane.tickets.retries import HOLD as RETRYING


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
    await store.stop(conn, ticket_id, f"stopped by {by}")
    await mandates.revoke(conn, ticket_id)
    await access.cancel_pending(conn, ticket_id, by=f"stopped by {by}")
    active = await conn.fetchval(
        "SELECT id FROM assignments WHERE ticket_id = $1 AND ended_at IS NULL", ticket_id
    )
    if active is not None:
        await slots.end(conn, active, "stopped")
    await conn.execute("SELECT pg_notify($1, $2)", Notify.WORKERS, ticket_id)
    return state


async def retry(pool: asyncpg.Pool, ticket_id: str, *, by: str, note: str = "") -> None:
    """Wake a worker that waits for people (after blocked, failed, or a question), or retry
    a failed round now instead of after its backoff."""
    async with pool.acquire() as conn, conn.transaction():
        state = await _state(conn, ticket_id)
        if state == TicketState.OPEN and await store.retry_now(conn, ticket_id, RETRYING):
            return  # its failed round is retried now rather than after the backoff
        if state != TicketState.WAITING_HUMAN:
            raise InvalidInput(f"{ticket_id} is {state}; only a ticket waiting for people retries")
        hold = await conn.fetchval("SELECT hold FROM tickets WHERE id = $1", ticket_id)
        if hold == access.HOLD:
            raise InvalidInput(
                f"{ticket_id} waits for its device's owner to approve; it goes on once they "
                "do (or reroute it to a device its requester may use)"
            )
        await events.add(conn, ticket_id, "retry", f"{by} asks you to try again. {note}".strip())


@dataclass(frozen=True)
class Rerouted:
    """Where a reroute sent the ticket; ``approval`` when it waits for the owner first."""

    ticket: str
    device: str  # its name
    owner: str
    approval: str | None = None

    @property
    def message(self) -> str:
        if self.approval is not None:
            return (
                f"{self.ticket} moves to {self.device} once {self.owner}, its owner, gives "
                f"approval ({self.approval}); they are asked on the ticket's thread, and "
                "nothing runs there before"
            )
        return f"{self.ticket} moves to {self.device}; it resumes once {self.device} is online"


async def reroute(
    pool: asyncpg.Pool,
    ticket_id: str,
    device: str,
    *,
    by: str,
    wait: timedelta,
    director: frozenset[str] = frozenset({access.ADMIN}),
) -> Rerouted:
    """Move the ticket to another device; what was queued for the old one is cancelled.
    The worker resumes once the new device is connected, if the ticket's requester may use
    it; otherwise once its owner approves. ``director`` is who asks for the move (the CLI and
    the console: the admin): a device's owner moving work onto it approves it."""
    async with pool.acquire() as conn, conn.transaction():
        state = await _state(conn, ticket_id)
        if state in CLOSED_TICKET_STATES:
            raise InvalidInput(f"{ticket_id} is {state}")
        found = await access.device(conn, device)
        title = await conn.fetchval("SELECT title FROM tickets WHERE id = $1", ticket_id)
        active = await conn.fetchval(
            "SELECT id FROM assignments WHERE ticket_id = $1 AND ended_at IS NULL", ticket_id
        )
        if active is not None:
            await slots.end(conn, active, "rerouted")
        await access.cancel_pending(conn, ticket_id, by=f"rerouted by {by}")
        grant = await device_grant.grant_ticket(
            conn,
            ticket_id,
            found,
            await access.requester_of_ticket(conn, ticket_id),
            by=by,
            what=f"{ticket_id} ({str(title)[:100]})",
            director=director,
            resume=TicketState.WAITING_DEVICE,
        )
        waits = not access.covers(grant)
        if not waits:
            await store.wait_for_device(conn, ticket_id, wait)
        await events.add(
            conn,
            ticket_id,
            "rerouted",
            f"{by} moved this ticket to the device {found.name}. Work queued for the old "
            "device was cancelled: check what exists on this one before going on.",
        )
        # What was queued for the old device must not run there later.
        await commands.cancel_queued_elsewhere(conn, ticket_id, found.id)
    return Rerouted(ticket_id, found.name, found.owner, grant["approval"] if waits else None)


async def cancel_stopped(pool: asyncpg.Pool, queue: CommandQueue) -> int:
    """Cancel device work that stopped tickets still have queued or running (done by the
    worker service after the stop committed, so a crash in between loses nothing)."""
    rows = await pool.fetch(
        "SELECT c.id FROM commands c JOIN tickets t ON t.id = c.ticket_id "
        "WHERE t.state = 'stopped' AND c.kind <> 'cancel' AND c.cancel_requested_at IS NULL "
        f"AND c.state IN ({LIVE_COMMAND_SQL}) LIMIT 100"
    )
    for row in rows:
        await queue.cancel(row["id"], grace_seconds=5)
    return len(rows)
