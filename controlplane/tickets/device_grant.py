"""A device for a ticket: checked for its requester (``gateway.authorization``), asked of
the owner when it must be, and recorded on the ticket."""

from __future__ import annotations

from typing import Any

from controlplane.db.pool import Conn
from controlplane.domain import TicketState
from controlplane.gateway.authorization import (
    HOLD,
    PENDING,
    Device,
    Requester,
    ask,
    check,
    dumps,
)
from controlplane.tickets import store


async def grant_ticket(
    conn: Conn,
    ticket_id: str,
    device: Device,
    requester: Requester,
    *,
    by: str,
    what: str,
    director: frozenset[str] = frozenset(),
    resume: str = TicketState.OPEN,
) -> dict[str, Any]:
    """Check ``device`` for the ticket's requester and record the grant on the ticket. When
    the owner must be asked, the ticket waits in ``waiting_human`` (hold ``device_approval``)
    until they answer; ``resume`` is the state it takes once they approve."""
    grant = check(device, requester, by=by, director=director)
    if grant["rule"] in (PENDING, "approved"):
        grant["approval"] = await ask(
            conn, grant, requester, what=what, ticket_id=ticket_id, resume=resume
        )
    await store.assign_device(
        conn,
        ticket_id,
        device.id,
        dumps(grant),
        waiting_for=HOLD if grant["rule"] == PENDING else None,
    )
    return grant
