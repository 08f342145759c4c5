"""What the deployment is doing, read from the database every replica shares.

Shown by ``superagent status`` and on the console.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.gateway.devices import ONLINE_WINDOW
from controlplane.leadership import ROUTER_LEASE


@dataclass
class Status:
    model: str
    router_leader: str | None
    router_leader_since: datetime | None
    router_lease_expires_at: datetime | None
    router_lease_expired: bool
    router_inbox: int
    tickets_active: int
    workers_running: int  # rounds holding a slot now
    tickets_waiting_device: int
    tickets_waiting_human: int
    devices_online: int
    devices_paired: int
    paused_at: datetime | None
    paused_by: str | None
    paused_reason: str | None


async def read(session: AsyncSession, model: str) -> Status:
    lease = (
        await session.execute(
            text(
                "SELECT holder, acquired_at, expires_at, expires_at < now() AS expired "
                "FROM leases WHERE name = :name"
            ),
            {"name": ROUTER_LEASE},
        )
    ).first()
    paused = (await session.execute(text("SELECT paused_at, paused_by, reason FROM pause"))).first()
    counts = (
        await session.execute(
            text(
                "SELECT "
                "(SELECT count(*) FROM triggers WHERE routed_at IS NULL) AS inbox, "
                "(SELECT count(*) FROM tickets WHERE state NOT IN "
                "  ('completed', 'failed', 'stopped')) AS tickets, "
                "(SELECT count(*) FROM assignments WHERE ended_at IS NULL) AS rounds, "
                "(SELECT count(*) FROM tickets WHERE state = 'waiting_device') AS away, "
                "(SELECT count(*) FROM tickets WHERE state = 'waiting_human') AS asking, "
                "(SELECT count(*) FROM devices WHERE revoked_at IS NULL "
                "  AND connected_replica IS NOT NULL "
                "  AND last_seen_at > now() - CAST(:window AS interval)) "
                "  AS online, "
                "(SELECT count(*) FROM devices WHERE revoked_at IS NULL) AS paired"
            ),
            {"window": ONLINE_WINDOW},
        )
    ).one()
    return Status(
        model=model,
        router_leader=lease.holder if lease else None,
        router_leader_since=lease.acquired_at if lease else None,
        router_lease_expires_at=lease.expires_at if lease else None,
        router_lease_expired=bool(lease.expired) if lease else False,
        router_inbox=counts.inbox,
        tickets_active=counts.tickets,
        workers_running=counts.rounds,
        tickets_waiting_device=counts.away,
        tickets_waiting_human=counts.asking,
        devices_online=counts.online,
        devices_paired=counts.paired,
        paused_at=paused.paused_at if paused else None,
        paused_by=paused.paused_by if paused else None,
        paused_reason=paused.reason if paused else None,
    )


def leader_line(status: Status) -> str:
    if status.router_leader is None:
        return "none: no replica is running (or none has started leading yet)"
    if status.router_lease_expired:
        return (
            f"none: {status.router_leader} stopped renewing its lease "
            f"{ago(status.router_lease_expires_at)}; another replica takes over at its "
            "next attempt"
        )
    assert status.router_lease_expires_at is not None
    left = (status.router_lease_expires_at - datetime.now(UTC)).total_seconds()
    return (
        f"{status.router_leader} (leading since {ago(status.router_leader_since)}, "
        f"lease renewed, {max(left, 0):.0f}s left)"
    )


def ago(when: datetime | None) -> str:
    if when is None:
        return "never"
    seconds = int((datetime.now(UTC) - when).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"
