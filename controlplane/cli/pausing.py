"""``superagent pause`` and ``resume``: hold everything the agent does, not what it hears."""

from __future__ import annotations

from datetime import datetime

import click

from controlplane import pause as pausing
from controlplane.cli.common import (
    clear_errors,
    json_option,
    load_settings,
    outcome,
    setup_logging,
)
from controlplane.cli.dbsession import run_with_pool
from controlplane.cli.remote import remote
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
    with clear_errors():
        over = remote()
    if over is not None:  # who pauses is the token's holder, whatever --by says
        with clear_errors():
            answer = over.post("/console/api/pause", {"reason": reason})
        since = datetime.fromisoformat(answer["since"])
    else:
        paused = run_with_pool(load_settings(), lambda pool: pausing.pause(pool, by, reason))
        answer = {"paused": True, "since": paused.at, "by": paused.by, "reason": paused.reason}
        since = paused.at
    outcome(as_json, answer, f"paused (since {ago(since)}, by {answer['by']})")


@click.command()
@json_option
def resume(as_json: bool) -> None:
    """Resume after `superagent pause`: what waited is handled now."""
    setup_logging("WARNING")
    with clear_errors():
        over = remote()
    if over is not None:
        with clear_errors():
            answer = over.post("/console/api/resume")
    else:
        ended = run_with_pool(load_settings(), pausing.resume)
        answer = (
            {"resumed": False}
            if ended is None
            else {"resumed": True, "paused_at": ended.at, "paused_by": ended.by}
        )
    if not answer["resumed"]:
        outcome(as_json, answer, "the agent was not paused")
        return
    at = answer["paused_at"]
    at = datetime.fromisoformat(at) if isinstance(at, str) else at
    outcome(as_json, answer, f"resumed (it was paused {ago(at)} by {answer['paused_by']})")
