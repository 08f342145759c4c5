"""Opening a ticket: a request becomes work, in one transaction (the caller's).

A ticket rests on one trigger, its mandate: an explicit request, or a candidate that its
source's ``auto`` mode accepted through the router's ``assess``. Opening it

1. checks that mandate and the threads it is to handle (the requester's own first: they
   hear back);
2. finds its device: the one the request names (:func:`.placement.named`), or, with none
   named and the repository known (``repo``, or the GitHub thread's own), one chosen in
   code (:func:`.placement.place`), whose clone becomes the ticket's ``workdir``; when the
   choice is the requester's, nothing is opened and :class:`NotOpened` names the
   candidates;
3. writes the ticket (:mod:`.store`), its mandate (:mod:`.mandates`) and its
   subscriptions (:mod:`.subscriptions`), and wakes the workers;
4. checks the device for the requester (:mod:`.device_grant`): their own or shared with
   them, else nothing runs until its owner approves in chat.

The same request and title make the same ticket, so a turn that runs again (a new router
leader after the last one died mid-turn) finds the ticket it already opened.
:func:`open_ticket` is the router's ``create_ticket``; the router validates the arguments
and says what happened.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from controlplane.db.pool import Conn
from controlplane.domain import Notify
from controlplane.gateway import authorization as access
from controlplane.ingest.intake import AdmissionSource
from controlplane.tickets import device_grant, mandates, placement, store, subscriptions
from superagent_shared.ids import stable_id


class NotOpened(Exception):
    """Why a request opens no ticket, in a sentence for whoever asked (the router's model)."""


@dataclass(frozen=True)
class Request:
    """What is asked for: see the router's ``create_ticket`` for each field's meaning."""

    title: str
    scope: str
    threads: Sequence[str]
    mandate_from: str  # the trigger whose request the ticket fulfils
    device: str | None = None  # a name or id, or "my …"; None: placed by the repository
    repo: str | None = None  # owner/name, when not the GitHub thread's own
    workdir: str | None = None  # None: the device's own clone of the repository
    speculative: bool | None = None
    start_from: str | None = None  # where the ticket's worktree starts (workspace_base)
    harness: str | None = None


@dataclass(frozen=True)
class Opened:
    """The ticket, and what opening it decided (``already``: a repeated request found the
    ticket it opened before, and decided nothing)."""

    ticket_id: str
    trigger_id: str
    already: bool = False
    kind: str = ""  # the mandate: explicit or inferred
    requester: str = ""  # the trigger's actor, by name
    threads: list[str] = field(default_factory=list)
    speculative: bool = False
    placed: placement.Placed | placement.Unplaced | None = None
    grant: dict[str, Any] | None = None  # the device's check for the requester

    @property
    def waits_for_approval(self) -> bool:
        return self.grant is not None and not access.covers(self.grant)


async def open_ticket(conn: Conn, request: Request, policy: AdmissionSource) -> Opened:
    """Open the ticket ``request`` asks for (see the module's doc); NotOpened saying why
    not. ``conn`` is in a transaction: a refusal leaves nothing behind."""
    trigger = await _trigger(conn, request.mandate_from)
    kind = await _mandate(conn, trigger)
    threads = await _threads(conn, request.threads, trigger["thread_id"])
    repo = request.repo or await _thread_repo(conn, trigger["thread_id"])
    try:
        device_id = await placement.named(conn, request.device, trigger["id"], repo=repo)
    except placement.NotNamed as why:
        raise NotOpened(str(why)) from None
    speculative = request.speculative is True or (
        kind == "inferred" and await _speculative_source(policy, trigger["source"])
    )
    ticket_id = stable_id("tkt", f"ticket:{trigger['id']}:{request.title}")
    if await conn.fetchval("SELECT 1 FROM tickets WHERE id = $1", ticket_id):
        return Opened(ticket_id, trigger["id"], already=True)
    placed, device_id, workdir = await _where(conn, policy, request, trigger["id"], repo, device_id)
    await store.create(
        conn,
        ticket_id,
        title=request.title,
        device_id=device_id,
        repo=repo,
        workdir=workdir,
        speculative=speculative,
        workspace_base=request.start_from,
        harness=request.harness,
    )
    await conn.execute("SELECT pg_notify($1, $2)", Notify.WORKERS, ticket_id)
    await mandates.record(conn, ticket_id, kind, trigger, request.scope)
    await subscriptions.subscribe_all(conn, ticket_id, threads)
    grant = None
    if device_id is not None:
        grant = await _grant(conn, ticket_id, device_id, trigger["id"], request.title)
    return Opened(
        ticket_id,
        trigger["id"],
        kind=kind,
        requester=trigger["actor_name"],
        threads=threads,
        speculative=speculative,
        placed=placed,
        grant=grant,
    )


async def _trigger(conn: Conn, trigger_id: str) -> asyncpg.Record:
    row = await conn.fetchrow(
        "SELECT id, source, thread_id, actor_id, actor_name, verdict, policy_version_id, "
        "person_id FROM triggers WHERE id = $1",
        trigger_id,
    )
    if row is None:
        raise NotOpened(f"no trigger {trigger_id}")
    return row


async def _mandate(conn: Conn, trigger: asyncpg.Record) -> str:
    """The mandate's kind the trigger gives: explicit, or inferred from an accepted
    candidate; NotOpened for anything else."""
    if trigger["verdict"] == "explicit":
        return "explicit"
    if trigger["verdict"] != "candidate":
        raise NotOpened(
            f"{trigger['id']} is not a request anyone may act on ({trigger['verdict']}); "
            "only explicit requests, or candidates accepted by assess, can start work"
        )
    accepted = await conn.fetchval(
        "SELECT outcome FROM router_decisions WHERE tool = 'assess' AND ok "
        "AND $1 = ANY(trigger_ids) ORDER BY created_at DESC LIMIT 1",
        trigger["id"],
    )
    if accepted != "accepted":
        raise NotOpened(
            f"{trigger['id']} is an inferred candidate; a ticket needs an assess of it "
            "that this source's auto mode accepts"
            + (f" (the last assess: {accepted})" if accepted else "")
        )
    return "inferred"


async def _threads(conn: Conn, ids: Sequence[str], own: str) -> list[str]:
    """``ids`` without repeats, each an existing thread, with the requester's own first
    when it is not among them (the requester hears back)."""
    wanted = list(dict.fromkeys(ids))
    rows = await conn.fetch("SELECT id FROM threads WHERE id = ANY($1)", wanted)
    found = {row["id"] for row in rows}
    missing = [i for i in wanted if i not in found]
    if missing:
        raise NotOpened(f"no such thread: {', '.join(missing)}")
    if own not in wanted:
        wanted.insert(0, own)
    return wanted


async def _speculative_source(policy: AdmissionSource, source: str) -> bool:
    """Whether the policy has the source's accepted candidates worked quietly."""
    return (await policy.current())[1].for_source(source).speculative


async def _thread_repo(conn: Conn, thread_id: str) -> str | None:
    thread = await conn.fetchrow("SELECT source, external_id FROM threads WHERE id = $1", thread_id)
    return placement.thread_repo(thread["source"], thread["external_id"]) if thread else None


async def _where(
    conn: Conn,
    policy: AdmissionSource,
    request: Request,
    trigger_id: str,
    repo: str | None,
    device_id: str | None,
) -> tuple[placement.Placed | placement.Unplaced | None, str | None, str | None]:
    """(the placement, if one was made; the device; the workdir) of the new ticket."""
    workdir = request.workdir
    if repo is None:
        return None, device_id, workdir
    if device_id is not None:
        return None, device_id, workdir or await placement.clone_on(conn, repo, device_id)
    placed = await _place(conn, policy, repo, trigger_id)
    if isinstance(placed, placement.Placed):
        return placed, placed.device_id, workdir or placed.workdir
    return placed, None, workdir


async def _place(
    conn: Conn, policy: AdmissionSource, repo: str, trigger_id: str
) -> placement.Placed | placement.Unplaced:
    """The device for the request's repository, chosen in code; NotOpened, naming the
    candidates, when the requester must choose."""
    routing = (await policy.current())[1].routing
    requester = await access.requester_of_trigger(conn, trigger_id)
    try:
        return await placement.place(
            conn, repo, requester, offline_owner_device=routing.offline_owner_device
        )
    except placement.AskWhich as ask:
        raise NotOpened(str(ask)) from None


async def _grant(
    conn: Conn, ticket_id: str, device_id: str, trigger_id: str, title: str
) -> dict[str, Any]:
    """The device checked for the requester, in code whatever the model chose: their own
    device, one shared with them, or else nothing runs until its owner approves."""
    return await device_grant.grant_ticket(
        conn,
        ticket_id,
        await access.device(conn, device_id),
        await access.requester_of_trigger(conn, trigger_id),
        by="the router",
        what=f"{ticket_id} ({title[:100]})",
    )
