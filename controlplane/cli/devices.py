"""``superagent devices``: pair, list and revoke the machines that run the agent's work."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TypeVar

import click
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.cli.common import clear_errors, load_settings, setup_logging
from controlplane.cli.dbsession import run_in_session
from controlplane.console.devices import pair_command
from controlplane.gateway import devices as device_registry
from controlplane.gateway import pairing
from controlplane.status import ago

T = TypeVar("T")


@click.group()
def devices() -> None:
    """Pair, list and revoke devices (machines running endpointd)."""
    setup_logging("WARNING")


@devices.command()
@click.option("--name", required=True, help="Name of the new device, e.g. alice-laptop.")
@click.option("--owner", help="The person the device belongs to.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def pair(name: str, owner: str | None, as_json: bool) -> None:
    """Create a one-time pairing code for a new device.

    The code is valid for 10 minutes, works once, and is locked after 5 wrong attempts.
    Run the printed `endpointd pair` command on the device.
    """
    settings = load_settings()

    async def work(session: AsyncSession) -> pairing.IssuedCode:
        return await pairing.create_code(
            session,
            device_name=name,
            owner=owner,
            created_by="cli",
        )

    issued = run_in_session(settings, work)
    with clear_errors():
        command, url, fingerprint = pair_command(settings, issued.display)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "code": issued.display,
                    "device_name": issued.device_name,
                    "expires_at": issued.expires_at.isoformat(),
                    "url": url,
                    "fingerprint": fingerprint,
                    "command": command,
                }
            )
        )
        return
    expires = issued.expires_at.strftime("%H:%M:%S UTC")
    click.echo(
        f"Pairing code for {issued.device_name}: {issued.display} (single use, until {expires})"
    )
    click.echo("On the device, run:")
    click.echo(f"  {command}")


@devices.command(name="list")
@click.option("--all", "include_revoked", is_flag=True, help="Include revoked devices.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_command(include_revoked: bool, as_json: bool) -> None:
    """Show devices: online or offline, last seen, queue depth, policy hash."""
    settings = load_settings()

    async def work(session: AsyncSession) -> list[device_registry.DeviceView]:
        return await device_registry.list_devices(
            session,
            include_revoked=include_revoked,
        )

    views = run_in_session(settings, work)
    if as_json:
        click.echo(json.dumps([asdict(v) for v in views], default=str, indent=2))
        return
    if not views:
        click.echo("No devices yet. Pair one with: superagent devices pair --name NAME")
        return
    header = f"{'NAME':<20} {'ID':<17} {'STATUS':<8} {'LAST SEEN':<10} {'QUEUE':>5}  POLICY"
    click.echo(header)
    for view in views:
        status = "revoked" if view.revoked else ("online" if view.online else "offline")
        policy = (view.policy_hash or "-")[:12]
        click.echo(
            f"{view.name:<20} {view.id:<17} {status:<8} {ago(view.last_seen_at):<10} "
            f"{view.queue_depth:>5}  {policy}"
        )


@devices.command()
@click.argument("device")
def revoke(device: str) -> None:
    """Revoke DEVICE (name or id): its connection closes now and it cannot reconnect."""
    settings = load_settings()

    async def work(session: AsyncSession) -> str:
        revoked = await device_registry.revoke(session, device)
        return f"{revoked.name} ({revoked.id})"

    click.echo(f"revoked {run_in_session(settings, work)}")
