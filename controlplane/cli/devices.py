"""``superagent devices``: pair, list, show, share and revoke the machines that run the agent's
work.

Work goes to a device only for its owner, for whom it is shared with, or with its owner's
approval in chat (controlplane.gateway.authorization).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from typing import Any, TypeVar

import asyncpg
import click

from controlplane.cli import ops
from controlplane.cli.common import (
    clear_errors,
    json_option,
    load_settings,
    outcome,
    setup_logging,
)
from controlplane.cli.dbsession import run_with_pool
from controlplane.cli.remote import remote, segment
from controlplane.console.devices import pair_command
from controlplane.deployment import ago
from controlplane.gateway import authorization as access
from controlplane.gateway import devices as device_registry
from controlplane.gateway import pairing, repositories
from superagent_shared import table

T = TypeVar("T")
FC = TypeVar("FC", bound=Callable[..., Any])


@click.group()
def devices() -> None:
    """Pair, list and revoke devices (machines running endpointd)."""
    setup_logging("WARNING")


@devices.command()
@click.option("--name", required=True, help="Name of the new device, e.g. alice-laptop.")
@click.option(
    "--owner",
    help="Who it belongs to: a person (superagent users) or an account SOURCE:ID with the "
    "channel's immutable id (github:583231). Default: you, the admin (web:admin).",
)
@click.option(
    "--shared",
    "shared_with",
    metavar="GROUP",
    help="A team device (CI box, shared dev server): usable by this group's members, "
    "SOURCE:GROUP as the channel reports it (slack:S0123ABCD, github:acme/devs).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def pair(name: str, owner: str | None, shared_with: str | None, as_json: bool) -> None:
    """Create a one-time pairing code for a new device.

    The code is valid for 10 minutes, works once, and is locked after 5 wrong attempts.
    Run the printed `endpointd pair` command on the device. Only the device's owner may
    direct work to it; others need a share (superagent devices share) or the owner's
    approval in chat.
    """
    with clear_errors():
        deployment = remote()
    if deployment is not None:
        # The deployment words the command: its gateway's address and certificate.
        with clear_errors():
            issued = deployment.post(
                "/console/api/devices/pair", {"name": name, "owner": owner, "shared": shared_with}
            )
    else:
        issued = _pair_here(name, owner, shared_with)
    if as_json:
        click.echo(json.dumps(issued))
        return
    expires = datetime.fromisoformat(issued["expires_at"]).strftime("%H:%M:%S UTC")
    click.echo(
        f"Pairing code for {issued['device_name']}: {issued['code']} (single use, until {expires})"
    )
    team = f", shared with {issued['shared_with']}" if issued["shared_with"] else ""
    click.echo(f"Owner: {issued['owner']}{team}")
    click.echo("On the device, run:")
    click.echo(f"  {issued['command']}")


def _pair_here(name: str, owner: str | None, shared_with: str | None) -> dict[str, Any]:
    """A code from the database, worded as the console's API words it."""
    settings = load_settings()

    async def work(pool: asyncpg.Pool) -> pairing.IssuedCode:
        return await pairing.create_code(
            pool,
            device_name=name,
            owner=owner,
            created_by="cli",
            shared_with=shared_with,
        )

    issued = run_with_pool(settings, work)
    with clear_errors():
        command, url, fingerprint = pair_command(settings, issued.display)
    return {
        "code": issued.display,
        "device_name": issued.device_name,
        "owner": issued.owner,
        "shared_with": issued.shared_with,
        "expires_at": issued.expires_at.isoformat(),
        "url": url,
        "fingerprint": fingerprint,
        "command": command,
    }


@devices.command(name="list")
@click.option("--all", "include_revoked", is_flag=True, help="Include revoked devices.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_command(include_revoked: bool, as_json: bool) -> None:
    """Show devices: owner, shares, status, last seen, queue depth, policy and sandbox.

    SANDBOX is how the device confines the commands it runs (its policy's mode, as its
    last connection reported it); devices whose commands run unconfined or only partly
    confined are listed below the table with the device's own description.
    """
    with clear_errors():
        deployment = remote()
    if deployment is not None:
        with clear_errors():
            answer = deployment.get("/console/api/devices")
        views = [device_registry.DeviceView.from_json(d) for d in answer["devices"]]
        views = [v for v in views if include_revoked or not v.revoked]
    else:
        settings = load_settings()

        async def work(pool: asyncpg.Pool) -> list[device_registry.DeviceView]:
            return await device_registry.list_devices(pool, include_revoked=include_revoked)

        views = run_with_pool(settings, work)
    if as_json:
        click.echo(json.dumps([asdict(v) for v in views], default=str, indent=2))
        return
    if not views:
        click.echo("No devices yet. Pair one with: superagent devices pair --name NAME")
        return
    header = (
        "NAME",
        "ID",
        "OWNER",
        "STATUS",
        "LAST SEEN",
        "QUEUE",
        "POLICY",
        "SANDBOX",
        "SHARED WITH",
    )
    rows = []
    notes = []
    for view in views:
        status = "revoked" if view.revoked else ("online" if view.online else "offline")
        policy = (view.policy_hash or "-")[:12]
        shown = device_registry.sandbox_shown(view)
        # The mode alone ("required", "best-effort", "off", "unknown"); "!" flags a warning.
        flag = "!" if view.sandbox_warning else ""
        mode = re.split(r"[;,:( ]", shown, maxsplit=1)[0][:12] + flag
        rows.append(
            (
                view.name,
                view.id,
                view.owner or access.ADMIN,
                status,
                ago(view.last_seen_at),
                view.queue_depth,
                policy,
                mode,
                ", ".join(view.shares) or "-",
            )
        )
        if view.revoked:
            continue
        if view.sandbox_warning:
            notes.append(f"! {view.name}: {view.sandbox_warning}\n    sandbox: {shown}")
        elif shown == device_registry.SANDBOX_UNKNOWN:
            notes.append(f"? {view.name}: sandbox {shown}; upgrade endpointd there to see it")
    for line in table.render(header, rows, right={5}):
        click.echo(line)
    if notes:
        click.echo("")
        for note in notes:
            click.echo(note)


@devices.command()
@click.argument("device")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def show(device: str, as_json: bool) -> None:
    """One device (name or id): owner, shares, status, sandbox, the repositories it
    reports under its allowed roots (which tickets for a repository are routed by), and the
    coding-agent CLIs (harnesses) it has and allows, which can work its tickets."""
    shown = ops.call("devices.show", device=device)
    if as_json:
        click.echo(json.dumps(shown, indent=2))
        return
    view = device_registry.DeviceView.from_json(shown)
    clones = [_clone(c) for c in shown["repositories"]]
    harnesses, default = shown["harnesses"], shown["default_harness"] or ""
    status = "revoked" if view.revoked else ("online" if view.online else "offline")
    for label, value in (
        ("device", f"{view.name} ({view.id})"),
        ("owner", view.owner or access.ADMIN),
        ("shared with", ", ".join(view.shares) or "-"),
        ("status", f"{status}, last seen {ago(view.last_seen_at)}"),
        ("queue", str(view.queue_depth)),
        ("version", view.version or "-"),
        ("policy", view.policy_hash or "-"),
        ("sandbox", device_registry.sandbox_shown(view)),
        ("repositories", _reported(view, len(clones))),
        ("harnesses", repositories.harnesses_shown(harnesses, default)),
    ):
        click.echo(f"{label + ':':<14}{value}")
    if clones:
        click.echo("")
        rows = [
            (c.owner_name or "-", c.default_branch or "-", c.path, c.remote or "-") for c in clones
        ]
        for line in table.render(("REPOSITORY", "DEFAULT BRANCH", "PATH", "REMOTE"), rows):
            click.echo(line)


def _reported(view: device_registry.DeviceView, count: int) -> str:
    """What the device said of its repositories, and when."""
    if view.repositories_reported_at is None:
        return "none reported (its endpointd predates the report, or has not connected since)"
    when = f"reported {ago(view.repositories_reported_at)}"
    more = (
        "; its scan stopped at its bounds: there may be more" if view.repositories_truncated else ""
    )
    return f"{count}, {when}{more}" if count else f"none under its allowed roots, {when}{more}"


def _grantees_option(help_text: str) -> Callable[[FC], FC]:
    """The ``--with`` option of share and unshare: one spelling for both, so that a share
    is taken back exactly as it was given; each command says in its own words what it does."""
    return click.option(
        "--with",
        "grantees",
        multiple=True,
        required=True,
        metavar="PERSON|ACCOUNT|GROUP",
        help=help_text,
    )


def _clone(data: dict[str, Any]) -> repositories.StoredRepository:
    return repositories.StoredRepository(
        path=data["path"],
        remote=data["remote"],
        owner_name=data["owner_name"],
        default_branch=data["default_branch"],
        reported_at=datetime.fromisoformat(data["reported_at"]),
    )


@devices.command()
@click.argument("device")
@_grantees_option(
    "A person (superagent users), an account SOURCE:ID, or a group group:SOURCE:ID "
    "(e.g. group:slack:S0123ABCD). Repeat for several."
)
@json_option
def share(device: str, grantees: tuple[str, ...], as_json: bool) -> None:
    """Let others direct work to DEVICE (name or id), on its owner's behalf.

    \b
    Examples:
      superagent devices share alice-laptop --with bob
      superagent devices share build-box --with group:github:acme/devs
    """
    found = ops.call("devices.share", device=device, grantees=list(grantees))
    outcome(
        as_json,
        found,
        f"{found['name']} (owner {found['owner']}) is shared with {', '.join(found['shares'])}",
    )


@devices.command()
@click.argument("device")
@_grantees_option("Whom to take the share back from, as it was given.")
@json_option
def unshare(device: str, grantees: tuple[str, ...], as_json: bool) -> None:
    """Take back shares of DEVICE: their tickets' next commands there are refused."""
    found = ops.call("devices.unshare", device=device, grantees=list(grantees))
    rest = ", ".join(found["shares"]) or "nobody else"
    outcome(as_json, found, f"{found['name']} (owner {found['owner']}) is now shared with {rest}")


@devices.command()
@click.argument("device")
@json_option
def revoke(device: str, as_json: bool) -> None:
    """Revoke DEVICE (name or id): its connection closes now and it cannot reconnect."""
    with clear_errors():
        deployment = remote()
    if deployment is not None:
        with clear_errors():
            revoked = deployment.post(f"/console/api/devices/{segment(device)}/revoke")
    else:

        async def work(pool: asyncpg.Pool) -> dict[str, Any]:
            done = await device_registry.revoke(pool, device)
            return {"id": done.id, "name": done.name, "revoked_at": done.revoked_at}

        revoked = run_with_pool(load_settings(), work)
    outcome(as_json, revoked, f"revoked {revoked['name']} ({revoked['id']})")
