"""The Tickets pages: the list, and one ticket with its threads, rounds, reports, commands
and its worker's timeline.

Built on :mod:`controlplane.workers.views` (what ``superagent tickets`` shows), plus what a
page has room for: the threads with their titles and links, who runs the current round,
the commands with their output, and the paired devices the ticket could move to. The
timeline (what the worker was told, said, called and got back, round by round) is
:mod:`controlplane.workers.timeline`'s, the same as ``superagent tickets show --transcript``.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from controlplane.console import commands
from controlplane.workers import timeline as worker_timeline
from controlplane.workers import views

LIST_LIMIT = 200


async def listing(pool: asyncpg.Pool, *, everything: bool) -> dict[str, Any]:
    found = await views.tickets(pool, everything=everything, limit=LIST_LIMIT)
    return {"everything": everything, "tickets": [ticket.as_json() for ticket in found]}


async def detail(pool: asyncpg.Pool, ticket_id: str) -> dict[str, Any]:
    """One ticket; NotFound when there is none."""
    data = (await views.detail(pool, ticket_id)).as_json()
    # Why its requester may use the device, in one line (the grant itself is device_grant).
    grant = data.get("device_grant")
    data["device_access"] = views.describe_grant(grant) if grant else None
    threads = await pool.fetch(
        "SELECT th.id, th.source, th.external_id, th.title, th.url, 'handles' AS relation, "
        "s.created_at FROM subscriptions s JOIN threads th ON th.id = s.thread_id "
        "WHERE s.ticket_id = $1 "
        "UNION ALL "
        "SELECT th.id, th.source, th.external_id, th.title, th.url, 'related to', "
        "l.created_at FROM links l JOIN threads th ON th.id = l.thread_id "
        "WHERE l.ticket_id = $1 ORDER BY created_at",
        ticket_id,
    )
    data["threads"] = [dict(row) for row in threads]
    worker = await pool.fetchrow(
        "SELECT id, lease_owner, lease_expires_at, turns FROM assignments "
        "WHERE ticket_id = $1 AND ended_at IS NULL",
        ticket_id,
    )
    data["worker"] = dict(worker) if worker else None
    data["commands"] = await commands.of_ticket(pool, ticket_id)
    # Where the Reroute action may send it.
    # (Moving it to a device its requester may not use waits for that device's owner.)
    paired = await pool.fetch(
        "SELECT id, name, owner FROM devices WHERE revoked_at IS NULL ORDER BY name"
    )
    data["paired_devices"] = [dict(row) for row in paired]
    return data


async def timeline(pool: asyncpg.Pool, ticket_id: str) -> dict[str, Any]:
    """The ticket's rounds with their entries, capped; NotFound when there is no ticket."""
    return (await worker_timeline.timeline(pool, ticket_id)).as_json()


async def message(pool: asyncpg.Pool, ticket_id: str, message_id: str) -> str:
    """One message of the ticket's worker, whole (an entry's ``recall`` id)."""
    return await worker_timeline.message_text(pool, ticket_id, message_id)
