"""``superagent pause`` and ``resume``: hold everything the agent does, not what it hears."""

from __future__ import annotations

import click

from controlplane import pause as pausing
from controlplane.cli.common import load_settings, setup_logging
from controlplane.cli.dbsession import run_with_pool
from controlplane.cli.versioned import default_author
from controlplane.deployment import ago


@click.command()
@click.option("--reason", default="", help="Shown by `superagent status` while paused.")
@click.option("--by", "by", default=default_author, show_default="user@host")
def pause(reason: str, by: str) -> None:
    """Pause the agent: no router turns, no dispatch, no replies, no commands started.

    Events keep being recorded and wait; `superagent resume` picks up from there. Work
    already running on devices is not killed (stop a ticket for that).
    """
    setup_logging("WARNING")
    paused = run_with_pool(load_settings(), lambda pool: pausing.pause(pool, by, reason))
    click.echo(f"paused (since {ago(paused.at)}, by {paused.by})")


@click.command()
def resume() -> None:
    """Resume after `superagent pause`: what waited is handled now."""
    setup_logging("WARNING")
    ended = run_with_pool(load_settings(), pausing.resume)
    if ended is None:
        click.echo("the agent was not paused")
    else:
        click.echo(f"resumed (it was paused {ago(ended.at)} by {ended.by})")
