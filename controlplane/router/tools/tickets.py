"""The router's tools over tickets: create one (on a trigger's authority), explain, forward
an event to, and stop one.

``create_ticket`` checks its arguments and opens the ticket with
:func:`controlplane.tickets.opening.open_ticket`, which holds the rules: one trigger as its
mandate (an explicit request, or a candidate accepted through ``assess``), the device named
or placed in code, checked for the requester (anyone else's waits, with nothing run, for
its owner's approval in chat). What opening refuses (including a choice of device that is
the requester's, with the candidates) is refused to the model.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from controlplane.ingest import inbox
from controlplane.router.tools.core import (
    Call,
    Done,
    RouterTools,
    batch_on,
    live_ticket,
    trigger,
)
from controlplane.tickets import control, explain, opening, placement
from controlplane.tools.fields import NON_BLANK, Arguments, ThreadId, TicketId, TriggerId
from controlplane.tools.problems import field_problem
from controlplane.tools.registry import Refused

tools = RouterTools()


def _device_named(value: str | None) -> str | None:
    if value is not None and not value.strip():
        raise field_problem("must be a device name or id, or null")
    return value


def _owner_name(value: str | None) -> str | None:
    if value == "":
        return None
    if value is not None and value.count("/") != 1:
        # A small model puts the checkout's path here: say where that goes.
        raise field_problem(
            f"must be owner/name (a repository on GitHub), not {value!r}; a directory on "
            "the device goes in workdir"
        )
    return value


def _text_or_none(value: str | None) -> str | None:
    if value == "":
        return None
    if value is not None and not value.strip():
        raise field_problem("must not be empty")
    return value


class CreateTicket(Arguments):
    title: Annotated[str, Field(max_length=300), NON_BLANK]
    scope: Annotated[
        str, Field(max_length=10_000, description="What is and is not to be done."), NON_BLANK
    ]
    threads: Annotated[
        list[ThreadId],
        Field(
            default_factory=list,
            description="Threads it handles besides the request's own (added for you).",
        ),
    ]
    device: Annotated[
        str | None,
        Field(
            description="A device name or id, or 'my laptop'; null unless the person named "
            "one: with the repository known, one that has it is chosen for you."
        ),
        AfterValidator(_device_named),
    ]
    mandate_from: Annotated[
        TriggerId | None,
        Field(
            description="The trigger (trg_…) whose request it fulfils; null: the batch's one "
            "explicit request."
        ),
    ] = None
    repo: Annotated[
        str | None,
        Field(
            max_length=300, description="owner/name, when not the GitHub thread's own repository."
        ),
        AfterValidator(_owner_name),
    ] = None
    workdir: Annotated[
        str | None,
        Field(
            max_length=4096,
            description="The repository's directory on the device; null: its own clone.",
        ),
        AfterValidator(_text_or_none),
    ] = None
    speculative: Annotated[
        bool | None,
        Field(description="Quietly reproduce and fix: nothing is said unless both succeed."),
    ] = None
    start_from: Annotated[
        Literal["default_branch", "local_changes"] | None,
        Field(
            description="Where its worktree starts: the default branch (a PR's head for work "
            "on that PR), or local_changes when asked to build on the requester's uncommitted "
            "work (a snapshot)."
        ),
    ] = None
    harness: Annotated[
        Literal["builtin", "qwen", "codex", "claude"] | None,
        Field(
            description="Only when the person asked for one: a coding-agent CLI on the "
            "device (Qwen Code, Codex CLI, Claude Code) or builtin (this agent's worker)."
        ),
    ] = None


@tools.tool(
    "create_ticket",
    "Create a ticket for work. mandate_from is the trigger whose request it fulfils: an "
    "explicit request, or a candidate accepted by assess. Its threads are subscribed.",
)
async def create_ticket(call: Call, args: CreateTicket) -> Done:
    mandate = args.mandate_from or await _the_request(call, args.threads)
    request = opening.Request(
        title=args.title,
        scope=args.scope,
        threads=args.threads,
        mandate_from=mandate,
        device=args.device,
        repo=args.repo,
        workdir=args.workdir,
        speculative=args.speculative,
        start_from=args.start_from,
        harness=args.harness,
    )
    try:
        opened = await opening.open_ticket(call.conn, request, call.policy)
    except opening.NotOpened as why:
        raise Refused(str(why)) from None
    if opened.already:
        return Done(
            {"ticket": opened.ticket_id, "already_created": True},
            f"{opened.ticket_id} already exists (a repeated turn)",
            [opened.trigger_id],
        )
    return Done(*_said(opened), [opened.trigger_id])


async def _the_request(call: Call, threads: list[str]) -> str:
    """The mandate a create_ticket without one means: the batch's only explicit request
    (on one of ``threads``, when they are named). Small models leave it out or fill it
    with a name; more than one request is refused, never guessed."""
    rows = await call.conn.fetch(
        "SELECT id, thread_id, actor_name FROM triggers WHERE id = ANY($1::text[]) "
        "AND verdict = 'explicit' ORDER BY created_at, id",
        list(call.turn.batch),
    )
    named = [row for row in rows if row["thread_id"] in threads]
    rows = named or rows
    if len(rows) == 1:
        return str(rows[0]["id"])
    if not rows:
        raise Refused(
            "mandate_from is needed: this batch has no explicit request to take as the "
            "mandate (give a candidate that assess accepted)"
        )
    listed = ", ".join(f"{row['id']} ({row['actor_name']})" for row in rows)
    raise Refused(f"mandate_from is needed: this batch has {len(rows)} requests: {listed}")


def _said(opened: opening.Opened) -> tuple[dict[str, Any], str]:
    """What the model sees of a new ticket, and the outcome on record."""
    ticket_id = opened.ticket_id
    content: dict[str, Any] = {
        "ticket": ticket_id,
        "subscribed": opened.threads,
        "mandate": opened.kind,
    }
    if opened.speculative:
        content["speculative"] = True
    outcome = f"created {ticket_id} ({opened.kind}, for {opened.requester})"
    placed = opened.placed
    if isinstance(placed, placement.Placed):
        content["placed"] = {"device": placed.why, "workdir": placed.workdir}
        outcome += f"; placed on {placed.why}"
    elif isinstance(placed, placement.Unplaced):
        content["no_device"] = placed.why
        outcome += f"; no device: {placed.why}"
    grant = opened.grant
    if grant is not None:
        content["device_access"] = grant["rule"]
    if grant is not None and opened.waits_for_approval:
        content["waits_for_approval"] = {
            "owner": grant["owner"],
            "approval": grant["approval"],
            "note": f"the device is {grant['owner']}'s: nothing runs until they "
            "approve; they are asked on the request's thread",
        }
        outcome += f"; waits for {grant['owner']}'s approval ({grant['approval']})"
    return content, outcome


class OfTicket(Arguments):
    ticket: TicketId


@tools.tool(
    "explain",
    "Why a ticket is where it is (for 'why is tkt_x stuck?'): its state and reason, "
    "device, current round and last activity, unfinished commands, last report, and "
    "the watchdog's findings and actions, all from the record.",
)
async def explain_ticket(call: Call, args: OfTicket) -> Done:
    found = await explain.facts(call.pool, args.ticket)
    if found is None:
        raise Refused(f"no ticket {args.ticket}")
    return Done(found, f"explained {args.ticket}", [])


class Forward(Arguments):
    trigger: TriggerId
    ticket: TicketId


@tools.tool(
    "forward",
    "Give an event to a ticket's worker (an event on a thread the ticket handles that "
    "reached you rather than the worker).",
)
async def forward(call: Call, args: Forward) -> Done:
    await trigger(call.conn, args.trigger)
    await live_ticket(call.conn, args.ticket)
    await inbox.forward(call.conn, args.ticket, args.trigger)
    return Done(
        {"forwarded": args.trigger, "to": args.ticket},
        f"forwarded to {args.ticket}",
        [args.trigger],
    )


class StopTicket(Arguments):
    ticket: TicketId
    reason: Annotated[str, Field(max_length=2000), NON_BLANK]


@tools.tool(
    "stop_ticket",
    "Stop a ticket for good (its mandate is revoked and its device work cancelled).",
)
async def stop_ticket(call: Call, args: StopTicket) -> Done:
    await live_ticket(call.conn, args.ticket)
    threads = [
        row["thread_id"]
        for row in await call.conn.fetch(
            "SELECT thread_id FROM subscriptions WHERE ticket_id = $1", args.ticket
        )
    ]
    was = await control.stop(call.conn, args.ticket, by="the router")
    # The request to stop: on one of the ticket's threads, or naming it elsewhere.
    concerned = await batch_on(call.conn, call.turn, threads, mentioning=args.ticket)
    return Done(
        {"stopped": args.ticket, "was": was}, f"stopped {args.ticket}: {args.reason}", concerned
    )
