"""What the ticket page can do to a ticket: stop it, retry it, move it to another device.

The same functions as ``superagent tickets stop`` / ``retry`` / ``reroute``
(:mod:`controlplane.tickets.control`), signed "the console" from a browser, and with the
name of the API token that asked otherwise; this module only words the answers.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import asyncpg

from controlplane.domain import CLOSED_TICKET_STATES
from controlplane.errors import Conflict
from controlplane.settings import Settings
from controlplane.tickets import control

BY = "the console"


async def stop(pool: asyncpg.Pool, ticket_id: str, *, by: str = BY) -> dict[str, Any]:
    """Stop the ticket; Conflict when it is already closed (nothing changes then)."""
    async with pool.acquire() as conn, conn.transaction():
        was = await control.stop(conn, ticket_id, by=by)
    if was in CLOSED_TICKET_STATES:
        raise Conflict(f"{ticket_id} is already {was}; there is nothing to stop")
    return {"ticket": ticket_id, "was": was, "message": f"Stopped {ticket_id} (it was {was})."}


async def retry(pool: asyncpg.Pool, ticket_id: str, note: str, *, by: str = BY) -> dict[str, Any]:
    """Wake a worker that waits for people; InvalidInput when the ticket does not."""
    await control.retry(pool, ticket_id, by=by, note=note.strip())
    return {"ticket": ticket_id, "message": f"{ticket_id} will try again."}


async def reroute(
    settings: Settings, pool: asyncpg.Pool, ticket_id: str, device: str, *, by: str = BY
) -> dict[str, Any]:
    """Move the ticket to a paired device (name or id); NotFound when there is none. As the
    admin (web:admin): a device the ticket's requester may not use waits for its owner."""
    wait = timedelta(seconds=settings.workers.device_wait_seconds)
    moved = await control.reroute(pool, ticket_id, device, by=by, wait=wait)
    return {
        "ticket": ticket_id,
        "device": moved.device,
        "approval": moved.approval,
        "message": f"{moved.message}.",
    }
