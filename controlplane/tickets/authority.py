"""Who carries authority in a worker's inbox, and which actions wait for people because
of input that does not.

Every channel event a worker reads is marked, from the trigger's stored facts and never
from its text:

* ``CI``: CI results (check runs and suites, workflow runs and jobs, statuses), whoever
  their sender is: a workflow run started by alice reports CI's output, not her words;
* ``bot``: a bot account;
* ``allowlisted requester``: a human on the source's allowlist (``triggers.allowlisted``,
  from the policy, whether or not the event addressed the agent) who asked for the ticket;
* ``allowlisted person``: another human on the allowlist;
* ``not allowlisted``: anybody else.

A retry from the console or CLI carries the operator's authority (``operator``); other
worker notices and job results carry none. Only these three may change the plan.

**Holds.** What the worker read since its last input with authority is kept on the ticket
(``tickets.untrusted_trigger_id``, ``untrusted_public``), updated in the transaction that
shows the events to the model. While input without authority is the latest, an action
with effects outside the device (:func:`external`: a pull request, a reply on GitHub, a
command given credentials, a push) is not run: the worker is told it is held, the round
ends, the ticket waits in ``waiting_human`` (hold ``confirmation``), and the requester is
asked once on the ticket's thread. Only input with authority wakes it; reading it clears
the mark, and the worker's repeated call runs. ``workers.hold_untrusted`` says where this
applies.

This module must not decide anything from an event's text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from controlplane.db.pool import Conn, Db
from controlplane.ingest.inbox import InboxEvent
from controlplane.replies import enqueue_reply
from controlplane.tickets import reports, slots, store
from superagent_shared.ids import stable_id

HoldMode = Literal["public", "always", "off"]

REQUESTER = "allowlisted requester"
ALLOWLISTED = "allowlisted person"
OPERATOR = "operator"
NOT_ALLOWLISTED = "not allowlisted"
BOT = "bot"
CI = "CI"
NONE = "none"
WITH_AUTHORITY = frozenset({REQUESTER, ALLOWLISTED, OPERATOR})

HOLD = "confirmation"  # tickets.hold while an action waits for people
# Event kinds (before the first dot) that are CI output, whoever sent them.
CI_KINDS = frozenset({"check_run", "check_suite", "workflow_run", "workflow_job", "status"})
# Worker notices written on an operator's word (console, CLI): controlplane.tickets.control.
OPERATOR_NOTICES = frozenset({"retry"})

# Defence in depth only: a command that pushes or talks to GitHub with the device's ambient
# login. The boundary is credentials (named, brokered by the device); a command can hide
# a push from any pattern, and the device's own policy is what stops those.
_PUSHES = re.compile(
    r"\bgit\b(?:\s+-{1,2}[\w.-]+(?:[= ]\S+)?)*\s+push\b"
    r"|\bgh\s+(?:pr|api|issue|release|repo|gist|workflow|secret)\b"
)
# Names said back on a thread in the agent's voice: plain handles only.
_PLAIN = re.compile(r"^[\w.\-\[\]]{1,50}$")


@dataclass(frozen=True)
class Requester:
    """Who asked for the ticket (its first mandate's initiator)."""

    actor_id: str | None
    person_id: str | None
    source: str | None
    name: str | None


async def requester(db: Db, ticket_id: str) -> Requester:
    row = await db.fetchrow(
        "SELECT m.initiator_id, m.person_id, m.initiator_name, g.source FROM mandates m "
        "LEFT JOIN triggers g ON g.id = m.trigger_id WHERE m.ticket_id = $1 "
        "ORDER BY m.created_at LIMIT 1",
        ticket_id,
    )
    if row is None:
        return Requester(None, None, None, None)
    return Requester(row["initiator_id"], row["person_id"], row["source"], row["initiator_name"])


def unheard(kind: str, is_bot: bool) -> str:
    """The mark of an event whose actor is not allowlisted."""
    if kind.split(".", 1)[0] in CI_KINDS:
        return CI
    return BOT if is_bot else NOT_ALLOWLISTED


def of(event: InboxEvent, asked_by: Requester) -> str:
    """The authority an event carries in the worker's inbox."""
    if event.kind.split(".", 1)[0] in CI_KINDS or event.actor_is_bot or not event.allowlisted:
        return unheard(event.kind, event.actor_is_bot)
    same_person = event.person_id is not None and event.person_id == asked_by.person_id
    same_account = event.actor_id == asked_by.actor_id and event.source == asked_by.source
    return REQUESTER if same_person or same_account else ALLOWLISTED


@dataclass(frozen=True)
class Heard:
    """One input the worker read, in the order it happened."""

    at: datetime
    authority: str
    trigger_id: str | None = None
    public: bool | None = None  # where it was said; None: not known


async def note(conn: Conn, ticket_id: str, heard: list[Heard]) -> None:
    """Record on the ticket what the worker just read (in the transaction that shows it):
    input with authority after the last input without clears the mark; input without
    authority after the last with sets it."""
    if not heard:
        return
    heard = sorted(heard, key=lambda h: h.at)
    last = max((i for i, h in enumerate(heard) if h.authority in WITH_AUTHORITY), default=-1)
    after = [h for h in heard[last + 1 :] if h.authority not in WITH_AUTHORITY | {NONE}]
    if not after and last < 0:
        return  # notices and job results only: nothing changes
    public = any(h.public is not False for h in after)  # unknown counts as public
    await store.note_untrusted(
        conn,
        ticket_id,
        after[-1].trigger_id if after else None,
        public=public,
        start_over=last >= 0,  # something with authority in between: earlier input is moot
    )


def external(name: str, args: dict[str, Any]) -> str | None:
    """What the call would do outside the device, or None if it stays on the device."""
    if name == "open_pull_request":
        return "open a pull request"
    if name == "reply_to_comment":
        return "reply on GitHub"
    if name != "shell":
        return None
    credentials = args.get("credentials")
    if credentials:
        names = sorted(
            {
                str(item["name"])
                for item in (credentials if isinstance(credentials, list) else [])
                if isinstance(item, dict) and _PLAIN.match(str(item.get("name", "")))
            }
        )
        return "run a command with the credentials " + (", ".join(names) or "it names")
    command = args.get("command")
    if isinstance(command, str) and _PUSHES.search(command):
        return "push or write to GitHub"
    return None


@dataclass(frozen=True)
class Untrusted:
    """The latest input without authority the worker read, which holds external actions."""

    trigger_id: str
    authority: str
    actor_name: str

    @property
    def said_by(self) -> str:
        """Who, as the agent may repeat it on a thread (plain handles only)."""
        return self.actor_name if _PLAIN.match(self.actor_name) else "someone"


async def untrusted(db: Db, ticket_id: str, mode: HoldMode) -> Untrusted | None:
    """The input that holds the ticket's external actions now, under ``mode``; None if
    nothing does."""
    if mode == "off":
        return None
    row = await db.fetchrow(
        "SELECT t.untrusted_public, g.id, g.kind, g.actor_is_bot, g.actor_name "
        "FROM tickets t JOIN triggers g ON g.id = t.untrusted_trigger_id WHERE t.id = $1",
        ticket_id,
    )
    if row is None or (mode == "public" and not row["untrusted_public"]):
        return None
    return Untrusted(row["id"], unheard(row["kind"], row["actor_is_bot"]), row["actor_name"])


def held_note(what: str, reason: Untrusted, asked: str) -> str:
    return (
        f"not run: held. You want to {what} right after reading {reason.trigger_id} "
        f"({reason.authority}), and nothing with authority since. {asked} is asked to "
        "confirm on the ticket's thread; your turn ends here. You are woken when someone "
        "with authority answers: if they confirm, make this call again."
    )


async def wait_for_confirmation(
    conn: Conn, ticket_id: str, assignment_id: str, what: list[str], reason: Untrusted
) -> bool:
    """End the round and wait in ``waiting_human`` for people to confirm; ask the requester
    once per input that caused it. False if the ticket was no longer running."""
    moved = await store.wait_for_people(conn, ticket_id, HOLD)
    await slots.end(conn, assignment_id, HOLD)
    if not moved:
        return False
    asked_by = await requester(conn, ticket_id)
    who = asked_by.name if asked_by.name and _PLAIN.match(asked_by.name) else None
    thread = await reports.home_thread(conn, ticket_id)
    if thread is not None:
        actions = " and ".join(dict.fromkeys(what))
        await enqueue_reply(
            conn,
            thread,
            f"{'@' + who + ': ' if who else ''}{ticket_id} wants to {actions}, right after "
            f"reading {reason.trigger_id} from {reason.said_by} ({reason.authority}), which "
            "carries no authority here. It is held until you confirm: reply here to go "
            "ahead, or say what to do instead.",
            stable_id("msg", f"confirm:{ticket_id}:{reason.trigger_id}"),
        )
    return True
