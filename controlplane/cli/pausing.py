"""``superagent pause`` and ``resume``: hold everything the agent does, not what it hears."""

from __future__ import annotations

import click

from controlplane import pause as pausing
from controlplane.cli.common import json_option, load_settings, outcome, setup_logging
from controlplane.cli.dbsession import run_with_pool
from controlplane.cli.versioned import default_author
from controlplane.deployment import ago


@click.command()
@click.option("--reason", default="", help="Shown by `superagent status` while paused.")
@click.option("--by", "by", default=default_author, show_default="user@host")
@json_option
def pause(reason: str, by: str, as_json: bool) -> None:
    """Pause the agent: no router turns, no dispatch, no replies, no commands started.

    Events keep being recorded and wait; `superagent resume` picks up from there. Work
    already running on devices is not killed (stop a ticket for that).
    """
    setup_logging("WARNING")
    paused = run_with_pool(load_settings(), lambda pool: pausing.pause(pool, by, reason))
    outcome(
        as_json,
        {"paused": True, "since": paused.at, "by": paused.by, "reason": reason},
        f"paused (since {ago(paused.at)}, by {paused.by})",
    )


@click.command()
@json_option
def resume(as_json: bool) -> None:
    """Resume after `superagent pause`: what waited is handled now."""
    setup_logging("WARNING")
    ended = run_with_pool(load_settings(), pausing.resume)
    if ended is None:
        outcome(as_json, {"resumed": False}, "the agent was not paused")
    else:
        outcome(
            as_json,
            {"resumed": True, "paused_at": ended.at, "paused_by": ended.by},
            f"resumed (it was paused {ago(ended.at)} by {ended.by})",
        )
