"""`endpointd audit`: the local log of what was refused and approved."""

from __future__ import annotations

import json

import click

from endpointd.cli.root import cli, json_option
from endpointd.paths import state_dir

# ---------------------------------------------------------------------------- audit


@cli.command()
@click.option("--tail", type=click.IntRange(min=1), metavar="N", help="Only the last N entries.")
@json_option("Machine-readable output: the log's JSON lines, one entry per line.")
def audit(tail: int | None, as_json: bool) -> None:
    """Show the local audit log: every refused command and every approval outcome.

    The log is audit.log in the state dir, one JSON object per line (time, event,
    command_id, rule, detail), readable only by you and never sent anywhere. Events include
    refused, approved, denied and approval_timeout; the rule is named as in policy.toml,
    so `endpointd policy check` can tell you why.
    """
    from endpointd.audit import AuditLog
    from endpointd.guard.approvals import printable

    entries = AuditLog(state_dir().path).tail(tail)
    if as_json:
        for entry in entries:
            click.echo(json.dumps(entry, ensure_ascii=False))
        return
    if not entries:
        click.echo("the audit log is empty")
        return
    for e in entries:
        line = (
            f"{e.get('time', '?')}  {e.get('event', '?')}  {e.get('command_id', '')}"
            f"  {e.get('rule', '')}: {e.get('detail', '')}"
        )
        click.echo(printable(line, limit=2000))
