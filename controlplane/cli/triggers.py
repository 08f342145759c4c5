"""``superagent triggers``: the router's inbox, and the events it set aside as undecidable."""

from __future__ import annotations

import json

import click

from controlplane.cli import ops
from controlplane.cli.common import json_option, outcome, setup_logging
from controlplane.domain import from_iso
from superagent_shared import table


@click.group()
def triggers() -> None:
    """See the router's inbox, and put back events it set aside as undecidable.

    An event the router's turns kept failing on (a malformed model answer, an error in
    the control plane) is tried alone, then, after router.quarantine_after failed turns,
    set aside as undecidable with its reason; the admin channel is told. Fix the cause
    (a prompt, a model, a bug), then retry it: the next router turn decides it.

    \b
    Examples:
      superagent triggers list
      superagent triggers list --undecidable --json
      superagent triggers show trg_8f3k2q4m9x1a
      superagent triggers retry trg_8f3k2q4m9x1a
    """


@triggers.command(name="list")
@click.option("--undecidable", is_flag=True, help="Only events set aside as undecidable.")
@click.option("--limit", default=50, show_default=True, help="At most this many.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_(undecidable: bool, limit: int, as_json: bool) -> None:
    """Events waiting for the router and those set aside as undecidable, oldest first."""
    setup_logging("WARNING")
    found = ops.call("triggers.list", undecidable=undecidable, limit=max(limit, 0))
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    if not found:
        click.echo(
            "No undecidable events."
            if undecidable
            else "Nothing waits for the router, and nothing is undecidable."
        )
        return
    rows = [
        (
            row["id"],
            row["state"],
            f"{row['source']}:{row['thread']}",
            f"{from_iso(row['created_at']):%Y-%m-%d %H:%M}",
            row["actor_name"],
            row["route_error"] or "",
        )
        for row in found
    ]
    header = ("TRIGGER", "STATE", "THREAD", "AT (UTC)", "FROM", "WHY")
    for line in table.render(header, rows):
        click.echo(line)


@triggers.command()
@click.argument("trigger")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def show(trigger: str, as_json: bool) -> None:
    """One TRIGGER: its thread, text, state, what the router decided, the calls its turns
    made (refused ones with why), failed turns and their reasons."""
    setup_logging("WARNING")
    row = ops.call("triggers.show", trigger=trigger)
    if as_json:
        click.echo(json.dumps(row, indent=2))
        return
    click.echo(f"{row['id']}: {row['verdict']} {row['kind']} from {row['actor_name']}")
    click.echo(f"  thread:   {row['thread_id']} ({row['source']}:{row['thread']})")
    click.echo(f"  state:    {row['state']}; route {row['route']}")
    click.echo(f"  at:       {from_iso(row['created_at']):%Y-%m-%d %H:%M:%S} UTC")
    if row["route_attempts"]:
        click.echo(f"  failed turns: {row['route_attempts']}, last: {row['route_error']}")
    if row["model_notice_at"] is not None:
        click.echo(
            f"  told the model was unreachable: {from_iso(row['model_notice_at']):%Y-%m-%d %H:%M}"
        )
    for failure in row["failures"]:
        mark = " (set aside)" if failure["quarantined"] else ""
        at = from_iso(failure["created_at"])
        click.echo(f"  failure {at:%Y-%m-%d %H:%M:%S}: {failure['error']}{mark}")
    click.echo(f"  decision: {row['decision']}")
    for call in row["calls"]:
        said = "ok      " if call["ok"] else "refused "
        arguments = json.dumps(call["arguments"], ensure_ascii=False, default=str)
        arguments = arguments if len(arguments) <= 200 else arguments[:199] + "…"
        click.echo(
            f"  call {from_iso(call['created_at']):%H:%M:%S} {said}{call['tool']} {arguments}: "
            f"{call['outcome']}"
        )
    text = " ".join(str(row["text"]).split())
    click.echo(f"  text:     {text[:500]}{' …' if len(text) > 500 else ''}")
    if row["undecidable_at"] is not None:
        click.echo(f"Once the cause is fixed: superagent triggers retry {row['id']}")


@triggers.command()
@click.argument("trigger")
@json_option
def retry(trigger: str, as_json: bool) -> None:
    """Put the undecidable TRIGGER back in the router's inbox, its failures forgotten."""
    setup_logging("WARNING")
    answer = ops.call("triggers.retry", trigger=trigger)
    outcome(
        as_json,
        answer,
        f"{trigger} is back in the router's inbox; the next turn decides it",
    )
