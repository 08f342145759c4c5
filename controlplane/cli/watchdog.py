"""``superagent watchdog``: the external control loop, and what it has found."""

from __future__ import annotations

import asyncio
import json
import logging
import os

import asyncpg
import click

from controlplane.cli.common import (
    clear_errors,
    fail,
    load_settings,
    run_until_signalled,
    say,
    setup_logging,
)
from controlplane.cli.dbsession import run_with_pool
from controlplane.db import migrate
from controlplane.db.database import open_database
from controlplane.db.pool import create_pool
from controlplane.db.urls import asyncpg_dsn
from controlplane.services import LOOPS_SHARE
from superagent_shared import table


@click.group(invoke_without_command=True)
@click.option("--once", is_flag=True, help="Run the checks once, print the findings, exit.")
@click.option(
    "--parent-pid",
    type=int,
    hidden=True,
    help="Exit when this process is gone (set by `superagent up` for its watchdog child).",
)
@click.pass_context
def watchdog(ctx: click.Context, once: bool, parent_pid: int | None) -> None:
    """Watch the deployment from outside the replicas, and act.

    Run it as its own process (one per deployment; a second one only repeats the same
    checks). Every SUPERAGENT_WATCHDOG__INTERVAL_SECONDS it checks replica heartbeats,
    expired leases, model and API error streaks, Postgres, device queues, and workers that
    stall, loop or drift from their ticket's goal (the last with a model configured).
    It nudges, requeues or stops workers, expires dead commands, pauses the agent on long
    model outages (if SUPERAGENT_WATCHDOG__PAUSE_AFTER_ERRORS is set) and alerts
    SUPERAGENT_WATCHDOG__ADMIN_THREAD. Everything it finds and does is recorded.

    \b
    Examples:
      superagent watchdog                    run (Ctrl-C stops)
      superagent watchdog --once             one pass, then print what is open
      superagent watchdog findings           what is open now, and what was done
      superagent watchdog why tkt_8f3k2q4m9x1a
    """
    if ctx.invoked_subcommand is not None:
        return
    settings = load_settings()
    setup_logging(settings.log_level)
    from controlplane.runtime import model_client  # the openai client: only when running
    from controlplane.watchdog.service import Watchdog

    client = model_client(settings) if settings.model_configured else None

    async def main(stop: asyncio.Event) -> None:
        with clear_errors(), open_database(settings) as database:
            pool = await create_pool(asyncpg_dsn(database.url), size=3)
            try:
                await migrate.check_migrated(pool)
                dog = Watchdog(pool, settings, client)
                if once:
                    await dog.check_once()
                    _print_open(await _open(pool))
                    return
                say(
                    f"watchdog: checking every {settings.watchdog.interval_seconds:g} s "
                    f"(model: {'yes' if client else 'none, no drift checks'}). Ctrl-C stops."
                )
                await dog.start()
                orphaned = (
                    asyncio.create_task(_parent_gone(parent_pid, stop))
                    if parent_pid is not None
                    else None
                )
                await stop.wait()
                if orphaned is not None:
                    orphaned.cancel()
                await dog.stop(settings.shutdown_timeout_seconds * LOOPS_SHARE)
            finally:
                await pool.close()

    run_until_signalled(main, shutdown_timeout=settings.shutdown_timeout_seconds)


async def _parent_gone(parent_pid: int, stop: asyncio.Event) -> None:
    """Stop once ``parent_pid`` is no longer our parent (it died, even by SIGKILL)."""
    # No event says a parent died (short of Linux-only prctl): its pid is polled.
    while os.getppid() == parent_pid:  # noqa: ASYNC110
        await asyncio.sleep(1.0)
    logging.getLogger(__name__).warning("watchdog: parent %d is gone; stopping", parent_pid)
    stop.set()


async def _open(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    from controlplane.findings import open_findings

    return await open_findings(pool)


def _print_open(rows: list[asyncpg.Record]) -> None:
    if not rows:
        click.echo("All quiet: no open findings.")
        return
    cells = [
        (
            row["severity"],
            row["kind"],
            row["subject"],
            f"{row['summary']} (since {row['first_seen_at']:%Y-%m-%d %H:%M} UTC, "
            f"seen {row['times_seen']}×)",
        )
        for row in rows
    ]
    header, *groups = table.layout(("SEVERITY", "KIND", "SUBJECT", "SUMMARY"), cells)
    click.echo("\n".join(header))
    for row, lines in zip(rows, groups, strict=True):
        click.echo("\n".join(lines))
        for action in row["actions"]:
            click.echo(f"  → {action}")


@watchdog.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def findings(as_json: bool) -> None:
    """Open findings, most severe first, with what the watchdog did about each."""
    setup_logging("WARNING")
    rows = run_with_pool(load_settings(), _open)
    if as_json:
        click.echo(json.dumps([dict(row) for row in rows], default=str, indent=2))
        return
    _print_open(rows)


@watchdog.command()
@click.argument("ticket")
@click.option("--json", "as_json", is_flag=True, help="The recorded facts, as JSON.")
def why(ticket: str, as_json: bool) -> None:
    """Why TICKET is where it is: its state, device, round, jobs, reports and findings."""
    setup_logging("WARNING")
    from controlplane.tickets.explain import facts, render

    found = run_with_pool(load_settings(), lambda pool: facts(pool, ticket))
    if found is None:
        fail(f"no ticket {ticket} (see `superagent tickets list --all`)")
        return
    click.echo(json.dumps(found, indent=2) if as_json else render(found))
