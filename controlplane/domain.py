"""The control plane's shared words: ticket and command states, NOTIFY channels, effect kinds.

This is the bottom layer. It imports nothing from the control plane, and every part that
stores a state, wakes another part, or enqueues an effect takes the word from here, so the
same word cannot drift apart in two modules.

The values are what the database stores (the CHECK constraints in ``db/models.py`` and the
migrations) and what goes over LISTEN/NOTIFY between replicas: renaming one is a migration
and a rolling-upgrade question, not an edit here. Each enum is a ``StrEnum``, so a member is
its value wherever a string goes: compared with a row's text, formatted into SQL or a log
line, sent as an asyncpg parameter, or written with ``json.dumps``. Only ``repr()`` differs.

SQL that filters on a set of states takes the literal list from here (``CLOSED_TICKET_SQL``
and friends) rather than spelling the set out again; a single state in a query stays a
plain literal, which the CHECK constraint keeps honest on writes.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from enum import StrEnum

__all__ = [
    "CLOSED_TICKET_SQL",
    "CLOSED_TICKET_STATES",
    "LIVE_COMMAND_SQL",
    "LIVE_COMMAND_STATES",
    "TERMINAL_COMMAND_SQL",
    "TERMINAL_COMMAND_STATES",
    "CommandState",
    "EffectKind",
    "Notify",
    "TicketState",
    "sql_list",
]


class TicketState(StrEnum):
    """``tickets.state``: where a unit of promised work stands (docs/architecture.md,
    *Domain model*)."""

    OPEN = "open"  # waiting for a worker round
    RUNNING = "running"  # a worker holds it
    WAITING_DEVICE = "waiting_device"  # its device is away, until ``wait_until``
    WAITING_HUMAN = "waiting_human"  # for a person: a question, a block, an approval (``hold``)
    READY = "ready"  # delivered a pull request, waiting for it to be merged or closed
    COMPLETED = "completed"
    FAILED = "failed"
    STOPPED = "stopped"


# Tickets in these states are done: they get no worker rounds and no more of their threads'
# events. (Ordered, so the SQL made from it is the same text in every process.)
CLOSED_TICKET_STATES: tuple[TicketState, ...] = (
    TicketState.COMPLETED,
    TicketState.FAILED,
    TicketState.STOPPED,
)


class CommandState(StrEnum):
    """``commands.state``: one device command's way from the queue to its result."""

    QUEUED = "queued"
    DELIVERED = "delivered"  # sent on the device's stream, not yet accepted
    # Accepted by the device, whose local policy holds it until a human there decides.
    AWAITING_APPROVAL = "awaiting_approval"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"  # not delivered before ``not_after``
    REFUSED = "refused"  # the device would not run it


# A command in one of these states has its final result; nothing changes it any more.
TERMINAL_COMMAND_STATES: tuple[CommandState, ...] = (
    CommandState.FINISHED,
    CommandState.FAILED,
    CommandState.CANCELLED,
    CommandState.EXPIRED,
    CommandState.REFUSED,
)
# Every other state: the command is queued or on its device.
LIVE_COMMAND_STATES: tuple[CommandState, ...] = (
    CommandState.QUEUED,
    CommandState.DELIVERED,
    CommandState.AWAITING_APPROVAL,
    CommandState.RUNNING,
)


class Notify(StrEnum):
    """The Postgres LISTEN/NOTIFY channels, each with what its payload carries."""

    ROUTER = "superagent_router"  # a trigger id for the router's inbox
    WORKERS = "superagent_workers"  # a ticket id that may need a worker round
    INBOX = "superagent_inbox"  # "trg_…:tkt_…,tkt_…" (a trigger, the tickets it went to)
    EFFECTS = "superagent_effects"  # empty: the outbox has something ready
    # A device id with new work, or the new command itself as JSON (gateway/queue.py).
    COMMANDS = "superagent_commands"
    # The id of a command that reached a final state, or its result as JSON (gateway/queue.py).
    COMMAND_DONE = "superagent_command_done"
    # "revoked:<device>" | "connected:<device>:<stream>:<connected at, µs, database clock>"
    DEVICES = "superagent_devices"
    WEBCHAT = "superagent_webchat"  # a conversation id whose messages changed


class EffectKind(StrEnum):
    """``effects.kind``: the outbox's kinds of external action, each with one handler."""

    # reply_id, thread_id, source, thread_external_id, text (channels/outbound.py)
    REPLY = "reply"
    # trigger_id, source, thread_external_id, message_ref (channels/outbound.py)
    ACKNOWLEDGE = "acknowledge"
    # A rules-only router's command run on a device (router/rules_only.py).
    RUN_COMMAND = "run_command"
    # A worker's pull request, opened on GitHub (channels/github/pull_requests.py).
    OPEN_PULL_REQUEST = "open_pull_request"


def sql_list(values: Iterable[str]) -> str:
    """``'a', 'b', 'c'``: values as SQL string literals, for ``IN (...)`` in a query's text."""
    return ", ".join("'" + value.replace("'", "''") + "'" for value in values)


# The sets above as SQL lists: ``WHERE state NOT IN ({CLOSED_TICKET_SQL})``.
CLOSED_TICKET_SQL = sql_list(CLOSED_TICKET_STATES)
TERMINAL_COMMAND_SQL = sql_list(TERMINAL_COMMAND_STATES)
LIVE_COMMAND_SQL = sql_list(LIVE_COMMAND_STATES)


def from_iso(value: str | None) -> datetime | None:
    """A time as the JSON answers carry it (ISO 8601; None stays None): what a view's
    ``from_json`` reads back from a deployment's answer over HTTP."""
    return None if value is None else datetime.fromisoformat(value)
