"""``superagent status``: what the deployment is doing, from the database every replica shares."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from controlplane import status as status_of
from controlplane.cli.common import load_settings, setup_logging
from controlplane.cli.dbsession import run_with_pool
from controlplane.status import ago


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(as_json: bool) -> None:
    """Show who leads the router, what waits for it, devices and tickets at a glance, and
    what was set aside after failing (quarantined), with the command that releases each.

    Reads the shared database, so it works from any machine that can reach it
    (DATABASE_URL), whether or not a replica runs here.
    """
    setup_logging("WARNING")
    settings = load_settings()
    model = settings.llm.router_model if settings.model_configured else "none (rules-only mode)"
    result = run_with_pool(settings, lambda pool: status_of.read(pool, model))
    if as_json:
        click.echo(json.dumps(asdict(result), default=str, indent=2))
        return
    if result.paused_at is not None:
        why = f": {result.paused_reason}" if result.paused_reason else ""
        click.echo(
            f"PAUSED since {ago(result.paused_at)} by {result.paused_by}{why} "
            "(events are recorded; `superagent resume` continues)"
        )
    click.echo(f"router leader:  {status_of.leader_line(result)}")
    click.echo(f"router inbox:   {result.router_inbox} event(s) waiting")
    click.echo(f"model:          {result.model}")
    click.echo(
        f"tickets:        {result.tickets_active} active: {result.workers_running} running, "
        f"{result.tickets_waiting_device} waiting for a device, "
        f"{result.tickets_waiting_human} waiting for people"
    )
    click.echo(f"devices:        {result.devices_online} online of {result.devices_paired} paired")
    click.echo(f"watchdog:       {status_of.watchdog_line(result)}")
    counts = result.quarantined_counts
    if not counts:
        click.echo("quarantined:    nothing")
        return
    click.echo(
        "quarantined:    "
        + ", ".join(f"{n} {_PLURAL[kind]}" for kind, n in counts.items())
        + " (each waits for people)"
    )
    for item in result.quarantined:
        click.echo(f"  {item.id}  {ago(item.since):>8}  {item.reason}")
        click.echo(f"  {'':16}  {'':>8}  release: {item.release}")
    shown = {kind: sum(1 for i in result.quarantined if i.kind == kind) for kind in counts}
    for kind, n in counts.items():
        if n > shown[kind]:
            click.echo(f"  … and {n - shown[kind]} more {_PLURAL[kind]}")


_PLURAL = {
    "trigger": "undecidable event(s)",
    "ticket": "blocked ticket(s)",
    "effect": "dead effect(s)",
}
