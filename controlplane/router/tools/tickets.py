"""The router's tools over tickets: create one (on a trigger's authority), explain, forward
an event to, and stop one.

``create_ticket`` rests on one trigger: an explicit request, or a candidate that its
source's ``auto`` mode accepted through ``assess``. The device must be the requester's own
or shared with them; any other waits, with nothing run, for its owner's approval in chat
(:mod:`controlplane.authorization`). With no device named and the repository known (``repo``,
or the GitHub thread's own), the device is chosen in code (:mod:`controlplane.tickets.placement`)
and the ticket's ``workdir`` is its clone; when the choice is the requester's, the call is
refused with the candidates, for the router to ask them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from controlplane.authorization import devices as access
from controlplane.domain import Notify
from controlplane.gateway import repositories
from controlplane.router.tools import devices
from controlplane.router.tools.core import Call, Done, RouterTools, live_ticket, thread_ids, trigger
from controlplane.tickets import control, device_grant, explain, placement, store
from controlplane.tools.fields import NON_BLANK, Arguments, ThreadId, TicketId, TriggerId
from controlplane.tools.problems import field_problem
from controlplane.tools.registry import Refused
from superagent_shared.ids import new_id, stable_id

tools = RouterTools()


def _device_named(value: str | None) -> str | None:
    if value is not None and not value.strip():
        raise field_problem("must be a device name or id, or null")
    return value


def _owner_name(value: str | None) -> str | None:
    if value == "":
        return None
    if value is not None and value.count("/") != 1:
        raise field_problem(f"must be owner/name, not {value!r}")
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
    threads: list[ThreadId]
    device: Annotated[
        str | None,
        Field(
            description="Device name or id, or 'my laptop' for one the requester owns. Null "
            "when the repository is known (repo, or the GitHub thread's own): a device that "
            "has it and that the requester may use is chosen for you."
        ),
        AfterValidator(_device_named),
    ]
    mandate_from: TriggerId
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
            description="The repository's directory on the device; null: the device's own "
            "clone of the repository, as it reported it.",
        ),
        AfterValidator(_text_or_none),
    ] = None
    speculative: Annotated[
        bool | None,
        Field(
            description="Quietly try to reproduce and fix: nothing is said or delivered unless "
            "the worker confirms both."
        ),
    ] = None
    start_from: Annotated[
        Literal["default_branch", "local_changes"] | None,
        Field(
            description="Where the ticket's own worktree starts: the freshly fetched default "
            "branch (the default; a pull request's head for work on an existing PR), or "
            "local_changes when the requester asks to build on their uncommitted work (a "
            "snapshot: their checkout stays as it is)."
        ),
    ] = None
    harness: Annotated[
        Literal["builtin", "qwen", "codex", "claude"] | None,
        Field(
            description="Who does the work, only when the person asked for one: a "
            "coding-agent CLI on the device (qwen: Qwen Code, codex: Codex CLI, claude: "
            "Claude Code) or builtin (this agent's own worker). Null: the repository's or "
            "the device's choice, else builtin."
        ),
    ] = None


@tools.tool(
    "create_ticket",
    "Create a ticket for work. mandate_from is the trigger whose request it fulfils: an "
    "explicit request, or a candidate accepted by assess. Its threads are subscribed.",
)
async def create_ticket(call: Call, args: CreateTicket) -> Done:
    conn, source_id = call.conn, args.mandate_from
    requested = await trigger(conn, source_id)
    if requested["verdict"] == "explicit":
        kind = "explicit"
    elif requested["verdict"] == "candidate":
        accepted = await conn.fetchval(
            "SELECT outcome FROM router_decisions WHERE tool = 'assess' AND ok "
            "AND $1 = ANY(trigger_ids) ORDER BY created_at DESC LIMIT 1",
            source_id,
        )
        if accepted != "accepted":
            raise Refused(
                f"{source_id} is an inferred candidate; a ticket needs an assess of it "
                "that this source's auto mode accepts"
                + (f" (the last assess: {accepted})" if accepted else "")
            )
        kind = "inferred"
    else:
        raise Refused(
            f"{source_id} is not a request anyone may act on ({requested['verdict']}); "
            "only explicit requests, or candidates accepted by assess, can start work"
        )
    threads = await thread_ids(conn, args.threads)
    if requested["thread_id"] not in threads:
        threads.insert(0, requested["thread_id"])  # the requester's thread hears back
    repo = args.repo or await _thread_repo(call, requested["thread_id"])
    device_id = await devices.named(conn, args.device, requested, repo=repo)
    speculative = args.speculative is True or (
        kind == "inferred"
        and (await call.policy.current())[1].for_source(requested["source"]).speculative
    )
    # The same request and title make the same ticket: a turn that runs again (a new
    # leader after the last one died mid-turn) finds the ticket it already created.
    ticket_id = stable_id("tkt", f"ticket:{source_id}:{args.title}")
    if await conn.fetchval("SELECT 1 FROM tickets WHERE id = $1", ticket_id):
        return Done(
            {"ticket": ticket_id, "already_created": True},
            f"{ticket_id} already exists (a repeated turn)",
            [source_id],
        )
    placed: placement.Placed | placement.Unplaced | None = None
    workdir = args.workdir
    if repo is not None and device_id is None:
        placed = await _place(call, repo, source_id)
        if isinstance(placed, placement.Placed):
            device_id, workdir = placed.device_id, workdir or placed.workdir
    elif repo is not None and device_id is not None and workdir is None:
        workdir = await _clone_on(call, repo, device_id)
    await store.create(
        conn,
        ticket_id,
        title=args.title,
        device_id=device_id,
        repo=repo,
        workdir=workdir,
        speculative=speculative,
        workspace_base=args.start_from,
        harness=args.harness,
    )
    await conn.execute("SELECT pg_notify($1, $2)", Notify.WORKERS, ticket_id)
    await conn.execute(
        "INSERT INTO mandates (id, ticket_id, kind, initiator_id, initiator_name, "
        "trigger_id, policy_version_id, scope, person_id) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        new_id("mnd"),
        ticket_id,
        kind,
        requested["actor_id"],
        requested["actor_name"],
        source_id,
        requested["policy_version_id"],
        args.scope,
        requested["person_id"],
    )
    await conn.execute(
        "INSERT INTO subscriptions (thread_id, ticket_id) SELECT unnest($1::text[]), $2",
        threads,
        ticket_id,
    )
    content: dict[str, Any] = {"ticket": ticket_id, "subscribed": threads, "mandate": kind}
    if speculative:
        content["speculative"] = True
    outcome = f"created {ticket_id} ({kind}, for {requested['actor_name']})"
    if isinstance(placed, placement.Placed):
        content["placed"] = {"device": placed.why, "workdir": placed.workdir}
        outcome += f"; placed on {placed.why}"
    elif isinstance(placed, placement.Unplaced):
        content["no_device"] = placed.why
        outcome += f"; no device: {placed.why}"
    if device_id is not None:
        # Checked here in code, whatever the model chose: the requester's own device, one
        # shared with them, or else nothing runs until the device's owner approves.
        grant = await device_grant.grant_ticket(
            conn,
            ticket_id,
            await access.device(conn, device_id),
            await access.requester_of_trigger(conn, source_id),
            by="the router",
            what=f"{ticket_id} ({args.title[:100]})",
        )
        content["device_access"] = grant["rule"]
        if not access.covers(grant):
            content["waits_for_approval"] = {
                "owner": grant["owner"],
                "approval": grant["approval"],
                "note": f"the device is {grant['owner']}'s: nothing runs until they "
                "approve; they are asked on the request's thread",
            }
            outcome += f"; waits for {grant['owner']}'s approval ({grant['approval']})"
    return Done(content, outcome, [source_id])


async def _thread_repo(call: Call, thread_id: str) -> str | None:
    thread = await call.conn.fetchrow(
        "SELECT source, external_id FROM threads WHERE id = $1", thread_id
    )
    return placement.thread_repo(thread["source"], thread["external_id"]) if thread else None


async def _clone_on(call: Call, repo: str, device_id: str) -> str | None:
    """The named device's own clone of ``repo``, if it reported one."""
    clones = (await repositories.clones_of(call.conn, repo)).get(device_id)
    return clones[0] if clones else None


async def _place(call: Call, repo: str, trigger_id: str) -> placement.Placed | placement.Unplaced:
    """The device for the request's repository, chosen in code; Refused, naming the
    candidates, when the requester must choose."""
    policy = (await call.policy.current())[1]
    requester = await access.requester_of_trigger(call.conn, trigger_id)
    try:
        return await placement.place(
            call.conn,
            repo,
            requester,
            offline_owner_device=policy.routing.offline_owner_device,
        )
    except placement.AskWhich as ask:
        raise Refused(str(ask)) from None


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
    await call.conn.execute(
        "INSERT INTO ticket_inbox (ticket_id, trigger_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        args.ticket,
        args.trigger,
    )
    await call.conn.execute(
        "SELECT pg_notify($1, $2)", Notify.INBOX, f"{args.trigger}:{args.ticket}"
    )
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
    was = await control.stop(call.conn, args.ticket, by="the router")
    return Done({"stopped": args.ticket, "was": was}, f"stopped {args.ticket}: {args.reason}", [])
