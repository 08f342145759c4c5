"""``superagent status``: what the deployment is doing, from the database every replica shares."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

import click
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.cli.common import load_settings, setup_logging
from controlplane.cli.dbsession import ago, run_in_session
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
    devices_online: int
    devices_paired: int
    paused_at: datetime | None
    paused_by: str | None
    paused_reason: str | None


async def _status(session: AsyncSession, model: str) -> Status:
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
        devices_online=counts.online,
        devices_paired=counts.paired,
        paused_at=paused.paused_at if paused else None,
        paused_by=paused.paused_by if paused else None,
        paused_reason=paused.reason if paused else None,
    )


def _leader_line(status: Status) -> str:
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


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(as_json: bool) -> None:
    """Show who leads the router, what waits for it, and devices and tickets at a glance.

    Reads the shared database, so it works from any machine that can reach it
    (DATABASE_URL), whether or not a replica runs here.
    """
    setup_logging("WARNING")
    settings = load_settings()
    model = settings.llm.router_model if settings.model_configured else "none (rules-only mode)"
    result = run_in_session(settings, lambda session: _status(session, model))
    if as_json:
        click.echo(json.dumps(asdict(result), default=str, indent=2))
        return
    if result.paused_at is not None:
        why = f": {result.paused_reason}" if result.paused_reason else ""
        click.echo(
            f"PAUSED since {ago(result.paused_at)} by {result.paused_by}{why} "
            "(events are recorded; `superagent resume` continues)"
        )
    click.echo(f"router leader:  {_leader_line(result)}")
    click.echo(f"router inbox:   {result.router_inbox} event(s) waiting")
    click.echo(f"model:          {result.model}")
    click.echo(f"tickets:        {result.tickets_active} active")
    click.echo(f"devices:        {result.devices_online} online of {result.devices_paired} paired")
