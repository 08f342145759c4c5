"""``superagent status``: what the deployment is doing, from the database every replica shares.

Everything above the last line is the deployment's view, read from the database: its model
is what the running replicas recorded with their heartbeats. The calling shell's own
settings are shown last, labelled as the shell's, because they are what a ``serve`` or
``say`` typed here would use, and they may well differ.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from controlplane import deployment
from controlplane.cli.common import clear_errors, load_settings, setup_logging
from controlplane.cli.dbsession import run_with_pool
from controlplane.cli.remote import remote
from controlplane.db import urls
from controlplane.deployment import ago
from controlplane.heartbeat import Record
from controlplane.settings import Settings


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(as_json: bool) -> None:
    """Show the running replicas (release, model, since when; version skew flagged), who
    leads the router and the model it runs with, what waits for it, tickets, devices, the
    watchdog's last pass and open findings, and what was set aside after failing
    (quarantined), with the command that releases each. Last, this shell's own settings.

    Reads the shared database, so it works from any machine that can reach it
    (DATABASE_URL), whether or not a replica runs here.
    """
    setup_logging("WARNING")
    with clear_errors():
        over = remote()
    if over is not None:
        with clear_errors():
            result = deployment.from_json(over.get("/console/api/status"))
    else:
        settings = load_settings()
        result = run_with_pool(settings, deployment.read)
        result.shell = _shell(settings)  # this shell's own, beside the deployment's
    if as_json:
        click.echo(json.dumps(asdict(result), default=str, indent=2))
        return
    if result.paused_at is not None:
        why = f": {result.paused_reason}" if result.paused_reason else ""
        click.echo(
            f"PAUSED since {ago(result.paused_at)} by {result.paused_by}{why} "
            "(events are recorded; `superagent resume` continues)"
        )
    _replicas(result)
    click.echo(f"router leader:  {deployment.leader_line(result)}")
    click.echo(f"model:          {_model_line(result)}")
    click.echo(f"router inbox:   {result.router_inbox} event(s) waiting")
    click.echo(
        f"tickets:        {result.tickets_active} active: {result.workers_running} running, "
        f"{result.tickets_waiting_device} waiting for a device, "
        f"{result.tickets_waiting_human} waiting for people"
    )
    _devices(result)
    click.echo(f"watchdog:       {deployment.watchdog_line(result)}")
    _findings(result)
    _quarantined(result)
    _shell_line(result)


def _replicas(result: deployment.Deployment) -> None:
    if not result.replicas:
        click.echo(f"replicas:       {deployment.NO_REPLICA}")
        last = result.last_replica
        if last is not None:
            gone = (
                f"stopped {ago(last.stopped_at)}"
                if last.stopped_at is not None
                else f"silent since {ago(last.heartbeat_at)}"
            )
            click.echo(f"  last seen: {last.id}  {last.version}  {gone}")
        return
    click.echo(f"replicas:       {len(result.replicas)} running")
    for replica in result.replicas:
        leader = "  (leader)" if replica.leader else ""
        click.echo(
            f"  {replica.id}  {replica.version}  up since {ago(replica.started_at)}, "
            f"beat {ago(replica.heartbeat_at)}  {replica.model}{leader}"
        )
    if result.version_skew:
        click.echo(
            f"  VERSION SKEW: the replicas run {', '.join(result.version_skew)}; "
            "upgrade them to one release"
        )
    if result.model_skew:
        click.echo(f"  MODEL SKEW: the replicas run {' / '.join(result.model_skew)}")


def _model_line(result: deployment.Deployment) -> str:
    if result.model_from is None:
        return result.model
    whose = next(r for r in result.replicas if r.id == result.model_from)
    return f"{result.model} ({'the leader' if whose.leader else whose.id}'s)"


def _devices(result: deployment.Deployment) -> None:
    click.echo(f"devices:        {result.devices_online} online of {result.devices_paired} paired")
    width = max((len(d.name) for d in result.devices), default=0)
    for device in result.devices:
        state = "online " if device.online else "offline"
        click.echo(f"  {device.name:<{width}}  {state}  last seen {ago(device.last_seen_at)}")
    if result.devices_paired > len(result.devices):
        more = result.devices_paired - len(result.devices)
        click.echo(f"  … and {more} more device(s) (`superagent devices list`)")


def _findings(result: deployment.Deployment) -> None:
    if not result.findings_open:
        click.echo("findings:       none open")
        return
    click.echo(f"findings:       {result.findings_open} open")
    for finding in result.findings:
        click.echo(
            f"  {finding.severity:<8}  {ago(finding.first_seen_at):>8}  {finding.kind}: "
            f"{finding.summary}"
        )
    if result.findings_open > len(result.findings):
        more = result.findings_open - len(result.findings)
        click.echo(f"  … and {more} more finding(s) (`superagent watchdog findings`)")


def _quarantined(result: deployment.Deployment) -> None:
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


def _shell_line(result: deployment.Deployment) -> None:
    shell = result.shell
    if shell is None:  # read over a context's HTTP API: this shell names no deployment
        return
    # Said only when the deployment's model is known: otherwise there is nothing to differ.
    differs = result.model_from is not None and shell.model != result.model
    note = ": not the deployment's" if differs else ""
    click.echo(f"this shell:     model {shell.model}{note}; database {shell.database}")


def _shell(settings: Settings) -> deployment.Shell:
    """This process's own settings, through the same allow-list a replica records with (so
    no key or password of the shell is printed either)."""
    model = deployment.model_phrase(Record.of(settings, []).runs_with())
    if settings.database_url is None:
        database = f"embedded Postgres in {settings.state_dir}"
    else:
        # Valid by now: the status above was read through it.
        url = urls.parse(settings.database_url)
        where = f"{url.host}:{url.port or 5432}" if url.host else "a local socket"
        database = f"{url.database or '(default)'} on {where}"
    return deployment.Shell(model=model, database=database)


_PLURAL = {
    "trigger": "undecidable event(s)",
    "ticket": "blocked ticket(s)",
    "effect": "dead effect(s)",
}
