"""``superagent effects``: the outbox's actions that gave up (dead), and putting them back."""

from __future__ import annotations

import json

import click

from controlplane.cli import ops
from controlplane.cli.common import json_option, outcome, setup_logging
from superagent_shared import table


@click.group()
def effects() -> None:
    """The outbox: every external action (a reply, a pull request...) runs from it after its
    transaction commits, retried with backoff. One that keeps failing is parked as dead,
    with its last error, until you retry it.

    \b
    Examples:
      superagent effects list --dead
      superagent effects retry eff_8f3k2q4m9x1a
    """


@effects.command(name="list")
@click.option("--dead", is_flag=True, help="Only those that gave up.")
@click.option("--limit", default=50, show_default=True, help="At most this many.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_(dead: bool, limit: int, as_json: bool) -> None:
    """Effects in the outbox, oldest first: waiting, retrying, or dead."""
    setup_logging("WARNING")
    rows = ops.call("effects.list", dead=dead, limit=limit)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("No dead effects." if dead else "The outbox is empty.")
        return
    shown = [
        (
            row["id"],
            row["kind"],
            "dead" if row["dead_at"] else f"{row['attempts']} attempt(s)",
            (row["last_error"] or "")[:200],
        )
        for row in rows
    ]
    for line in table.render(("EFFECT", "KIND", "STATE", "LAST ERROR"), shown):
        click.echo(line)


@effects.command()
@click.argument("effect")
@json_option
def retry(effect: str, as_json: bool) -> None:
    """Run a dead EFFECT again, from its first attempt."""
    setup_logging("WARNING")
    answer = ops.call("effects.retry", effect=effect)
    outcome(
        as_json,
        answer,
        f"{effect} is back in the outbox; it runs at once.",
    )
