"""What every router tool shares: where a call comes from (:class:`Turn`), what it runs
with (:class:`Call`), what it answers (:class:`Done`, :class:`ToolResult`), and the
lookups that refuse an unknown trigger, thread or closed ticket."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import asyncpg

from controlplane.db.pool import Conn
from controlplane.domain import CLOSED_TICKET_STATES
from controlplane.ingest.intake import AdmissionSource
from controlplane.tools.registry import Refused, Registry

__all__ = ["Call", "Done", "Replies", "RouterTools", "ToolResult", "Turn"]


@dataclass(frozen=True)
class Turn:
    """Where a tool call comes from: the router session, its model call, and the batch."""

    session_id: str | None
    llm_call_id: str | None
    batch: Sequence[str]  # the trigger ids of this turn's batch

    @property
    def key(self) -> str:
        """What names this turn among the session's (its batch's first trigger)."""
        return self.batch[0] if self.batch else self.llm_call_id or ""


@dataclass(frozen=True)
class ToolResult:
    ok: bool
    content: dict[str, Any]  # what the model sees, as JSON
    decision_id: str
    # The triggers an accepted call decided (a ticket's mandate, a reply, subscribe or
    # link on their thread, an ignore, an assessment, a forward, a stop of their ticket):
    # a turn must decide each of its batch.
    decided: tuple[str, ...] = ()

    def as_message(self) -> str:
        return json.dumps(self.content, ensure_ascii=False, default=str)


class Done(NamedTuple):
    """A tool's answer: what the model sees, the outcome on record, the triggers concerned."""

    content: dict[str, Any]
    outcome: str
    triggers: list[str]


@dataclass
class Replies:
    """How many replies each thread got in the current turn (a batch's first trigger)."""

    batch: str = ""
    counts: dict[str, int] = field(default_factory=dict)

    def nth(self, batch: str, thread_id: str) -> int:
        """This reply's number among the turn's replies to ``thread_id``, from 0."""
        if batch != self.batch:  # a new turn: the old counts are done with
            self.counts.clear()
            self.batch = batch
        nth = self.counts.get(thread_id, 0)
        self.counts[thread_id] = nth + 1
        return nth

    def made(self, batch: str, thread_id: str) -> bool:
        """Whether the turn over ``batch`` has replied on ``thread_id``."""
        return batch == self.batch and self.counts.get(thread_id, 0) > 0


@dataclass(frozen=True)
class Call:
    """What a router tool runs with: the toolbox's state, the call's transaction and turn."""

    pool: asyncpg.Pool
    policy: AdmissionSource
    conn: Conn
    turn: Turn
    replies: Replies


RouterTools = Registry[Call, Done]


async def trigger(conn: Conn, trigger_id: str) -> asyncpg.Record:
    row = await conn.fetchrow(
        "SELECT id, source, thread_id, actor_id, actor_name, verdict, policy_version_id, "
        "person_id FROM triggers WHERE id = $1",
        trigger_id,
    )
    if row is None:
        raise Refused(f"no trigger {trigger_id}")
    return row


async def thread_ids(conn: Conn, ids: Sequence[str]) -> list[str]:
    """``ids`` without repeats, each an existing thread."""
    wanted = list(dict.fromkeys(ids))
    found = {
        row["id"] for row in await conn.fetch("SELECT id FROM threads WHERE id = ANY($1)", wanted)
    }
    missing = [i for i in wanted if i not in found]
    if missing:
        raise Refused(f"no such thread: {', '.join(missing)}")
    return wanted


async def live_ticket(conn: Conn, ticket_id: str) -> None:
    state = await conn.fetchval("SELECT state FROM tickets WHERE id = $1", ticket_id)
    if state is None:
        raise Refused(f"no ticket {ticket_id}")
    if state in CLOSED_TICKET_STATES:
        raise Refused(f"ticket {ticket_id} is {state}")


async def batch_on(
    conn: Conn, turn: Turn, threads: Sequence[str] = (), mentioning: str | None = None
) -> list[str]:
    """The turn's triggers on ``threads``, or whose text names ``mentioning`` (a ticket id):
    those a call acting there (a subscribe, a link, a stop) decides, though it names none."""
    rows = await conn.fetch(
        "SELECT id FROM triggers WHERE id = ANY($1::text[]) AND (thread_id = ANY($2::text[]) "
        "OR ($3::text IS NOT NULL AND strpos(text, $3::text) > 0)) ORDER BY created_at, id",
        list(turn.batch),
        list(threads),
        mentioning,
    )
    return [row["id"] for row in rows]
