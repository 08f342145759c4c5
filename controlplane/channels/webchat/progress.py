"""What a chat message was promised, and whether it arrived: the ``progress`` frame.

A reply such as "Running on laptop: … (the result follows here)" promises a later one. A
client that waits for it (``superagent say``) must know that from the records, never from
the reply's wording, so this module reads what the agent recorded about the message:

* a ``/run``: the outbox's ``run_command`` effect keyed by the message's trigger id; its
  outcome is the reply :func:`controlplane.replies.run_result_id` (pending until that reply
  is sent; dropped if the effect died);
* a ticket filed on its authority (a mandate from the message): its first report, which
  has arrived once the router has had its turn over it (or at once, when the report
  carries no trigger: the router was told in its own turn); dropped if the ticket ended
  with no report.

``refused``: a ``/run`` the agent would not queue (no such device, a command it cannot
run), with why: nothing will come of it, and the client should say so as a failure.

``handled``: the router has decided what to do with the message (every promise it makes is
recorded by then). ``replies_queued``: replies to the conversation written but not yet sent.
``settled``: handled, nothing pending, nothing queued; nothing more is owed to the message.

Read only; it writes nothing, and knows nothing of sockets (the hub sends the frames).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import asyncpg

from controlplane.domain import CLOSED_TICKET_STATES, EffectKind
from controlplane.replies import run_result_id

_TRIGGER = "SELECT thread_id, route, routed_at IS NOT NULL AS routed FROM triggers WHERE id = $1"

# The /run's effect (gone once done), and its outcome reply: queued, or sent.
_RUN = """
SELECT
    (SELECT dead_at IS NOT NULL FROM effects WHERE kind = $2 AND key = $1) AS run_dead,
    EXISTS (SELECT 1 FROM effects WHERE kind = $3 AND key = $4 AND dead_at IS NULL)
        AS result_queued,
    EXISTS (SELECT 1 FROM sent_messages WHERE reply_id = $4) AS result_sent
"""

# Tickets filed on the message, and whether their first final report was passed on:
# NULL (none yet), false (the router's turn over it is still to come), true.
_TICKETS = """
SELECT m.ticket_id, t.state,
    (SELECT r.trigger_id IS NULL OR rt.routed_at IS NOT NULL
     FROM reports r LEFT JOIN triggers rt ON rt.id = r.trigger_id
     WHERE r.ticket_id = m.ticket_id AND r.status <> 'progress'
     ORDER BY r.created_at LIMIT 1) AS reported
FROM mandates m JOIN tickets t ON t.id = m.ticket_id
WHERE m.trigger_id = $1 AND NOT t.speculative
ORDER BY m.created_at, m.ticket_id
"""

# The message's /run, refused: its decision on record, not ok.
_REFUSED = """
SELECT outcome FROM router_decisions
WHERE $1 = ANY(trigger_ids) AND tool = 'run' AND NOT ok
ORDER BY created_at
"""

# Replies to the thread in the outbox and not sent yet (a sent one's effect may linger).
_QUEUED = """
SELECT count(*) FROM effects e
WHERE e.kind = $1 AND e.dead_at IS NULL AND e.payload->>'thread_id' = $2
  AND NOT EXISTS (SELECT 1 FROM sent_messages s WHERE s.reply_id = e.key)
"""


@dataclass
class Progress:
    thread: str  # the conversation id
    trigger: str
    handled: bool = False
    pending: list[dict[str, str]] = field(default_factory=list)
    arrived: list[dict[str, str]] = field(default_factory=list)
    dropped: list[dict[str, str]] = field(default_factory=list)
    refused: list[dict[str, str]] = field(default_factory=list)
    replies_queued: int = 0

    @property
    def settled(self) -> bool:
        return self.handled and not self.pending and not self.replies_queued

    def frame(self) -> dict[str, Any]:
        return {
            "type": "progress",
            "thread": self.thread,
            "trigger": self.trigger,
            "handled": self.handled,
            "pending": self.pending,
            "arrived": self.arrived,
            "dropped": self.dropped,
            "refused": self.refused,
            "replies_queued": self.replies_queued,
            "settled": self.settled,
        }


async def of(pool: asyncpg.Pool, trigger_id: str, conversation: str) -> Progress:
    """What the message ``trigger_id`` on ``conversation`` was promised, as recorded now."""
    found = Progress(conversation, trigger_id)
    async with pool.acquire() as conn:
        trigger = await conn.fetchrow(_TRIGGER, trigger_id)
        if trigger is None:
            return found
        found.handled = trigger["route"] != "router" or trigger["routed"]
        run = await conn.fetchrow(
            _RUN, trigger_id, EffectKind.RUN_COMMAND, EffectKind.REPLY, run_result_id(trigger_id)
        )
        assert run is not None
        promise = {
            "kind": "run",
            "id": trigger_id,
            "see": f"superagent say --follow --conversation {conversation}",
        }
        if run["result_sent"]:
            found.arrived.append(promise)
        elif run["result_queued"] or run["run_dead"] is False:
            found.pending.append(promise)
        elif run["run_dead"]:
            found.dropped.append(promise)
        for why in await conn.fetch(_REFUSED, trigger_id):
            found.refused.append({"kind": "run", "id": trigger_id, "why": why["outcome"]})
        for row in await conn.fetch(_TICKETS, trigger_id):
            ticket = {
                "kind": "ticket",
                "id": row["ticket_id"],
                "see": f"superagent tickets show {row['ticket_id']}",
            }
            if row["reported"]:
                found.arrived.append(ticket)
            elif row["reported"] is None and row["state"] in CLOSED_TICKET_STATES:
                found.dropped.append(ticket)
            else:
                found.pending.append(ticket)
        found.replies_queued = int(
            await conn.fetchval(_QUEUED, EffectKind.REPLY, trigger["thread_id"]) or 0
        )
    return found
