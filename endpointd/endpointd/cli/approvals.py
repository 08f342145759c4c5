"""`endpointd approvals`, `approve` and `deny`: the owner's answers to `ask` rules."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from endpointd.cli.root import cli, echo_json, json_option
from endpointd.paths import state_dir

if TYPE_CHECKING:
    from endpointd.guard.approvals import ApprovalRequest

# ---------------------------------------------------------------------------- approvals


@cli.command()
@json_option()
@click.option(
    "--show",
    "show_id",
    metavar="ID",
    help="Print one request whole: nothing cut, every argument, the stdin preview.",
)
def approvals(as_json: bool, show_id: str | None) -> None:
    """List commands waiting for your approval on this machine.

    A command matching an "ask" rule of the local policy is held, and the control plane
    shows it as waiting for local approval, until you run `endpointd approve ID` or
    `endpointd deny ID`; nobody answering before limits.ask_timeout_seconds (default 5
    minutes) denies it. Each entry shows what would run: the whole command, its directory,
    the environment variables it sets, the start of its stdin (with its size and SHA-256),
    the credentials it gets and how, who asked, the rule, and the time left. Long text is
    wrapped; a field too long to list is cut with its length and SHA-256, and `endpointd
    approvals --show ID` prints it all. Control characters are shown escaped (a newline as
    \\n), so every line break you see is a wrap. A desktop notification is shown where
    notify-send or osascript exists.
    """
    from endpointd.guard.approvals import Approvals, header, render
    from endpointd.guard.approvals import as_json as request_json

    queue = Approvals(state_dir().path)
    if show_id is not None:
        request = queue.show(show_id)
        if as_json:
            click.echo(json.dumps(request_json(request), indent=2))
            return
        click.echo(header(request))
        for line in render(request, full=True):
            click.echo(line)
        return
    pending = queue.pending()
    if as_json:
        click.echo(json.dumps([request_json(r) for r in pending], indent=2))
        return
    if not pending:
        click.echo("no commands are waiting for approval")
        return
    for r in pending:
        click.echo(header(r))
        for line in render(r):
            click.echo(line)
    click.echo("answer with `endpointd approve ID` or `endpointd deny ID`")


@cli.command()
@click.argument("command_id", metavar="ID")
@json_option()
def approve(command_id: str, as_json: bool) -> None:
    """Let a command held by an "ask" rule run.

    ID is the command id shown by `endpointd approvals` (a unique prefix is enough). The
    daemon starts the command within a moment. An id that is unknown, already answered or
    timed out is an error and changes nothing; approving never changes the policy itself.
    Only you can approve: this is refused when run by a command endpointd started, and the
    daemon ignores any answer not made by this command (it is signed with a key the
    running daemon made and commands cannot read), noting the attempt in the audit log.
    Look at the request first (`endpointd approvals`, `endpointd approvals --show ID`).
    """
    from endpointd.guard.approvals import Approvals, printable

    request = Approvals(state_dir().path).decide(command_id, approve=True)
    if as_json:
        echo_json(_decided(request))
        return
    click.echo(f"approved {printable(request.command_id)}: {printable(request.summary)}")


@cli.command()
@click.argument("command_id", metavar="ID")
@json_option()
def deny(command_id: str, as_json: bool) -> None:
    """Refuse a command held by an "ask" rule.

    ID is the command id shown by `endpointd approvals` (a unique prefix is enough). The
    control plane is told the user denied it on the device, and the refusal is written to
    the audit log. An id that is unknown, already answered or timed out is an error and
    changes nothing. Like `endpointd approve`, this is refused when run by a command
    endpointd started.
    """
    from endpointd.guard.approvals import Approvals, printable

    request = Approvals(state_dir().path).decide(command_id, approve=False)
    if as_json:
        echo_json(_decided(request))
        return
    click.echo(f"denied {printable(request.command_id)}: {printable(request.summary)}")


def _decided(request: ApprovalRequest) -> dict[str, Any]:
    """What `approve --json` and `deny --json` print: the answer and what it answered."""
    return {
        "command_id": request.command_id,
        "decision": request.decision,
        "approved": request.decision == "approved",
        "summary": request.summary,
        "origin": request.origin,
        "rule": request.rule,
        "decided_at": request.decided_at,
    }
