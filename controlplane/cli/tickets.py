"""``superagent tickets``: what the workers are doing, and stop, retry or move their work."""

from __future__ import annotations

import json
from datetime import timedelta

import asyncpg
import click

from controlplane.cli.common import (
    clear_errors,
    json_option,
    load_settings,
    outcome,
    setup_logging,
)
from controlplane.cli.dbsession import run_with_pool
from controlplane.cli.remote import RemoteError, remote, segment
from controlplane.domain import CLOSED_TICKET_STATES, TicketState
from controlplane.errors import Conflict
from controlplane.tickets import control
from controlplane.workers import timeline, views
from superagent_shared import table


@click.group()
def tickets() -> None:
    """See and steer tickets: the work people asked for, each run by its own worker.

    A ticket is open, then running on its device; it may wait for its device
    (waiting_device) or for people (waiting_human: a question, or blocked, or failed); it
    is ready when its pull request is open, and completed once that is merged or closed.

    \b
    Examples:
      superagent tickets list
      superagent tickets show tkt_8f3k2q4m9x1a
      superagent tickets show tkt_8f3k2q4m9x1a --transcript
      superagent tickets recall tkt_8f3k2q4m9x1a msg_3j9w2k7c1d0e
      superagent tickets retry tkt_8f3k2q4m9x1a --note "the flaky test is fixed on main"
      superagent tickets reroute tkt_8f3k2q4m9x1a bob-desktop
      superagent tickets stop tkt_8f3k2q4m9x1a
    """


def _since(view: views.TicketView) -> str:
    if view.state == TicketState.WAITING_DEVICE and view.wait_until is not None:
        return f"waits until {view.wait_until:%Y-%m-%d %H:%M} UTC"
    return f"{view.updated_at:%Y-%m-%d %H:%M}"


@tickets.command(name="list")
@click.option("--all", "everything", is_flag=True, help="Closed tickets too.")
@click.option("--limit", default=50, show_default=True, help="At most this many.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_(everything: bool, limit: int, as_json: bool) -> None:
    """Tickets, newest first: open ones, or --all."""
    setup_logging("WARNING")
    with clear_errors():
        deployment = remote()
    if deployment is not None:
        with clear_errors():
            answer = deployment.get("/console/api/tickets", all=everything)
        found = [views.TicketView.from_json(t) for t in answer["tickets"]][:limit]
    else:
        found = run_with_pool(
            load_settings(), lambda pool: views.tickets(pool, everything=everything, limit=limit)
        )
    if as_json:
        click.echo(json.dumps([view.as_json() for view in found], indent=2))
        return
    if not found:
        click.echo("No tickets." if everything else "No open tickets (--all shows closed ones).")
        return
    rows = [
        (
            view.id,
            view.state + (f" ({view.hold})" if view.hold else ""),
            view.device or "-",
            f"{view.tokens:,}",
            _since(view),
            view.title,
        )
        for view in found
    ]
    for line in table.render(
        ("TICKET", "STATE", "DEVICE", "TOKENS", "SINCE", "TITLE"), rows, right={3}
    ):
        click.echo(line)


@tickets.command()
@click.argument("ticket")
@click.option(
    "--transcript",
    is_flag=True,
    help="What the worker did instead, round by round: what it was told, what it said, "
    "each tool call with its arguments and each result (long ones capped).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def show(ticket: str, transcript: bool, as_json: bool) -> None:
    """One TICKET: its scope, threads, reports and rounds.

    With --transcript, its worker's timeline (the console's ticket page shows the same):
    each round's header, then who spoke and what. A long text is cut, saying how much is
    left out and under which id; `superagent tickets recall TICKET MSG` prints it whole.

    \b
    Example (--transcript):
      round 1  asg_5m2k…  new, regular slot  2 model calls  ready  2026-05-04 10:02 → 10:04 UTC
        10:02:11  control plane: brief
                  Fix the flaky login test …
                  … 14 more lines (recall msg_3j9w2k7c1d0e)
        10:02:15  worker → shell  {"command":"pytest -q tests/test_login.py"}
        10:02:21  ← shell
                  exit_code: 1
    """
    setup_logging("WARNING")
    if transcript:
        _transcript(ticket, as_json)
        return
    with clear_errors():
        deployment = remote()
    if deployment is not None:
        with clear_errors():
            answer = deployment.get(f"/console/api/tickets/{segment(ticket)}")
        found = views.TicketDetail.from_json(answer)
    else:
        found = run_with_pool(load_settings(), lambda pool: views.detail(pool, ticket))
    if as_json:
        click.echo(json.dumps(found.as_json(), indent=2))
        return
    view = found.ticket
    click.echo(f"{view.id}: {view.title}")
    click.echo(f"  state:    {view.state}" + (f" ({view.hold})" if view.hold else ""))
    click.echo(f"  asked by: {view.initiator or '-'}; scope: {found.scope or '-'}")
    click.echo(
        f"  device:   {view.device or '-'}" + ("  [speculative]" if view.speculative else "")
    )
    if view.device_grant is not None:
        click.echo(f"  access:   {views.describe_grant(view.device_grant)}")
    click.echo(f"  spent:    {view.tokens:,} tokens, ${view.cost_usd:.4f}")
    if view.last_error and (view.failed_rounds or view.hold == "blocked"):
        click.echo(f"  failed:   {view.last_error}")
        if view.retry_at is not None:
            click.echo(
                f"  retries:  round {view.failed_rounds + 1} at {view.retry_at:%H:%M:%S} UTC "
                f"(`superagent tickets retry {view.id}` tries now)"
            )
    if view.pr_url:
        click.echo(f"  pull request: {view.pr_url}")
    for thread in found.threads:
        click.echo(f"  thread:   {thread}")
    for report in found.reports:
        click.echo(f"  report {report['at'][:16]} {report['status']}: {report['summary']}")
        if report["question"]:
            click.echo(f"    question: {report['question']}")
    for round_ in found.rounds:
        click.echo(
            f"  round {round_['id']} ({round_['woken_by']}, {round_['slot']} slot): "
            f"{round_['model_calls']} model calls, {round_['outcome']}"
        )


def _transcript(ticket: str, as_json: bool) -> None:
    with clear_errors():
        deployment = remote()
    if deployment is not None:
        with clear_errors():
            answer = deployment.get(f"/console/api/tickets/{segment(ticket)}/timeline")
        found = timeline.Timeline.from_json(answer)
    else:
        found = run_with_pool(load_settings(), lambda pool: timeline.timeline(pool, ticket))
    if as_json:
        click.echo(json.dumps(found.as_json(), indent=2))
        return
    title = _printable(f"{found.ticket_id}: {found.title}")
    click.echo(click.style(title, bold=True) + f"  ({found.state})")
    if found.earlier:
        click.echo(click.style(f"({found.earlier:,} earlier messages are not shown)", dim=True))
    if not found.rounds:
        click.echo("No rounds yet.")
    for round_ in found.rounds:
        click.echo("")
        click.echo(_round_header(round_))
        if not round_.entries:
            click.echo("  (nothing said)")
        for entry in round_.entries:
            for line in _entry_lines(entry):
                click.echo(line)


def _round_header(round_: timeline.Round) -> str:
    span = f"{round_.started:%Y-%m-%d %H:%M}" + (f" → {round_.ended:%H:%M}" if round_.ended else "")
    head = click.style(f"round {round_.number}", bold=True)
    return (
        f"{head}  {round_.id}  {round_.woken_by}, {round_.slot} slot  "
        f"{round_.model_calls} model calls  {click.style(round_.status, bold=True)}  {span} UTC"
    )


_INDENT = " " * 12  # under the heading, past its time

# What a worker's session holds came from a model and from a device's commands: control
# characters in it (an escape sequence in a build's output) are shown, never sent to the
# terminal to act on. Line breaks and tabs are kept.
_CONTROLS = {
    code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0)) if chr(code) not in "\n\t"
}


def _printable(text: str) -> str:
    return text.translate(_CONTROLS)


def _entry_lines(entry: timeline.Entry) -> list[str]:
    heading = click.style(_printable(entry.heading), fg="red" if entry.error else None, bold=True)
    if entry.kind == "call":  # compact: the arguments on the heading's line
        waiting = click.style("  (waiting for its result)", dim=True) if entry.pending else ""
        lines = [f"  {entry.at:%H:%M:%S}  {heading}  {_printable(entry.text)}{waiting}"]
    else:
        lines = [f"  {entry.at:%H:%M:%S}  {heading}"]
        lines += [_INDENT + line for line in _printable(entry.text).split("\n")]
    if entry.more:
        lines.append(_INDENT + click.style(f"… {entry.more} (recall {entry.message_id})", dim=True))
    return lines


@tickets.command()
@click.argument("ticket")
@click.argument("message")
@json_option
def recall(ticket: str, message: str, as_json: bool) -> None:
    """Print MESSAGE of TICKET's worker whole: the id a capped entry of
    `superagent tickets show TICKET --transcript` names (msg_…)."""
    setup_logging("WARNING")
    with clear_errors():
        deployment = remote()
    if deployment is not None:
        with clear_errors():
            text = deployment.text(
                f"/console/api/tickets/{segment(ticket)}/messages/{segment(message)}"
            )
    else:
        text = run_with_pool(
            load_settings(), lambda pool: timeline.message_text(pool, ticket, message)
        )
    outcome(as_json, {"ticket": ticket, "message": message, "text": text}, _printable(text))


@tickets.command()
@click.argument("ticket")
@json_option
def stop(ticket: str, as_json: bool) -> None:
    """Stop TICKET for good: its mandate is revoked and its device work cancelled."""
    setup_logging("WARNING")

    async def work(pool: asyncpg.Pool) -> str:
        async with pool.acquire() as conn, conn.transaction():
            return await control.stop(conn, ticket, by="the CLI")

    with clear_errors():
        deployment = remote()
    if deployment is not None:
        with clear_errors():
            try:
                was = deployment.post(f"/console/api/tickets/{segment(ticket)}/stop")["was"]
            except RemoteError as exc:
                if exc.status != Conflict.http_status:  # already closed: nothing changed
                    raise
                outcome(as_json, {"ticket": ticket, "stopped": False}, exc.message)
                return
    else:
        was = run_with_pool(load_settings(), work)
    stopped = was not in CLOSED_TICKET_STATES
    outcome(
        as_json,
        {"ticket": ticket, "stopped": stopped, "was": was},
        f"stopped {ticket} (it was {was}); its device work is being cancelled"
        if stopped
        else f"{ticket} was already {was}",
    )


@tickets.command()
@click.argument("ticket")
@click.option("--note", default="", help="What changed, for the worker to read.")
@json_option
def retry(ticket: str, note: str, as_json: bool) -> None:
    """Wake TICKET's worker again after a question, blocked or failed."""
    setup_logging("WARNING")
    with clear_errors():
        deployment = remote()
    if deployment is not None:
        with clear_errors():
            deployment.post(f"/console/api/tickets/{segment(ticket)}/retry", {"note": note})
    else:
        run_with_pool(
            load_settings(), lambda pool: control.retry(pool, ticket, by="the CLI", note=note)
        )
    outcome(as_json, {"ticket": ticket, "retried": True}, f"{ticket} will try again")


@tickets.command()
@click.argument("ticket")
@click.argument("device")
@json_option
def reroute(ticket: str, device: str, as_json: bool) -> None:
    """Move TICKET to DEVICE (name or id); what was queued for the old one is cancelled.

    DEVICE must be the ticket's requester's, shared with them, or yours (the admin's);
    otherwise the ticket waits for DEVICE's owner to approve in chat.
    """
    setup_logging("WARNING")
    with clear_errors():
        deployment = remote()
    if deployment is not None:
        with clear_errors():
            answer = deployment.post(
                f"/console/api/tickets/{segment(ticket)}/reroute", {"device": device}
            )
        outcome(as_json, answer, str(answer["message"]).rstrip("."))
        return
    settings = load_settings()
    wait = timedelta(seconds=settings.workers.device_wait_seconds)
    # As the admin (web:admin): on the admin's own devices that is the owner's direction;
    # on anyone else's the ticket's requester must be let in, or the owner is asked.
    moved = run_with_pool(
        settings, lambda pool: control.reroute(pool, ticket, device, by="the CLI", wait=wait)
    )
    data = {
        "ticket": ticket,
        "device": moved.device,
        "approval": moved.approval,
        "message": f"{moved.message}.",
    }
    outcome(as_json, data, moved.message)
