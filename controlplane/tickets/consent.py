"""Owner consent: someone asks to use a device that is not theirs; its owner answers in chat.

The word is *consent* (the device's owner lets someone else's work run on it); endpointd's
"approvals" are a device's own local answers to its ``ask`` rules. Where people and data
see it, consent keeps its older name: owners answer ``approve apr_…``, and the rows are
``device_approvals`` and ``approval_answers``; an "approval" below is one such row.

An approval is opened where work is pointed at the device (:func:`.devices.ask`: the
router's ``create_ticket``, rules-only ``/run``, a reroute); nothing of it runs meanwhile.
:class:`ConsentService`, which every replica runs in every mode (rules-only included),
then does the rest, each pass at least once a second:

1. **Ask**, once: one message through the outbox on the request's thread, addressed to the
   owner ("For alice: bob asks to run tkt_x (…) on your device alice-laptop: reply
   `approve apr_…` or `deny apr_…` by 14:32 UTC; no answer counts as a deny"). The deadline
   starts then (``workers.device_approval_seconds``).
2. **Read answers**: any message, on any channel and thread, whose text holds
   ``approve apr_…`` or ``deny apr_…``. Who answered is what the channel verified about the
   message (its actor's immutable id and linked person), never a display name and never
   the model; only the device's owner counts. Every answer is recorded in
   ``approval_answers`` with its outcome and why. An answer from anyone else, from a bot,
   or after the deadline changes nothing.
3. **Expire** what nobody answered in time: a timeout is a deny.

Approved, a ticket's grant records the approval (rule ``approved``) and the ticket goes on: a
new one opens, a rerouted one waits for its device as any reroute does. A ``/run`` is queued.
Denied or expired, the ticket is stopped (its hold says which) and its thread is told; a
``/run`` does not run.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from controlplane.db.pool import Conn
from controlplane.domain import CLOSED_TICKET_STATES, EffectKind, Notify, TicketState
from controlplane.effects.outbox import enqueue
from controlplane.gateway import authorization as devices
from controlplane.identities import SOURCES
from controlplane.replies import enqueue_reply
from controlplane.services import Service, critical_loop, is_transient, sleep_unless
from controlplane.settings import Settings
from controlplane.tickets import control, reports, store
from superagent_shared.ids import stable_id

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0
_BATCH = 50
ANSWER = re.compile(r"\b(approve|deny)\s+`?(apr_[0-9a-z]{12})\b", re.IGNORECASE)

# Messages that may hold an answer, read through the partial index ix_triggers_approval_answers
# (the condition must be written exactly as the index's), since the oldest pending approval.
_MAYBE_ANSWERS = """
SELECT g.id, g.text, g.source, g.actor_id, g.actor_name, g.actor_is_bot, g.actor_groups,
       g.thread_id, p.name AS person
FROM triggers g LEFT JOIN people p ON p.id = g.person_id
WHERE g.text LIKE '%apr\\_%' AND g.created_at >= $1
  AND NOT EXISTS (SELECT 1 FROM approval_answers x WHERE x.trigger_id = g.id)
ORDER BY g.created_at, g.id
LIMIT 100
"""

_APPROVAL = """
SELECT a.*, d.name AS device, coalesce(nullif(d.owner, ''), $2) AS device_owner,
       coalesce(a.expires_at <= now(), false) AS late
FROM device_approvals a JOIN devices d ON d.id = a.device_id
WHERE a.id = $1
FOR UPDATE OF a
"""


def answers_in(text: str) -> list[tuple[str, str]]:
    """(verb, approval id) pairs a message holds, one per approval (the first wins)."""
    found: dict[str, str] = {}
    for verb, approval_id in ANSWER.findall(text):
        found.setdefault(approval_id.lower(), verb.lower())
    return [(verb, approval_id) for approval_id, verb in found.items()]


def _handle(principals: list[str]) -> str:
    """How to name a requester in `superagent devices share --with`: person, else account."""
    people_ = [p for p in principals if ":" not in p]
    accounts = [p for p in principals if ":" in p and not devices.is_group(p)]
    return (people_ or accounts or ["PERSON"])[0]


class ConsentService(Service):
    """Asks owners for their consent, reads their answers and expires the unanswered (see
    the module)."""

    name = "approvals"

    def __init__(self, pool: asyncpg.Pool, settings: Settings) -> None:
        super().__init__()
        self.pool = pool
        self.timeout = timedelta(seconds=settings.workers.device_approval_seconds)
        self.device_wait = timedelta(seconds=settings.workers.device_wait_seconds)

    async def run(self) -> None:
        await critical_loop(self.name, self._step, self.stopping)

    async def _step(self) -> None:
        await self.pass_once()
        await sleep_unless(self.stopping, POLL_SECONDS)

    async def pass_once(self) -> int:
        """One pass: ask, read answers, expire. Returns how many things it did."""
        return await self._ask() + await self._answers() + await self._expire()

    # -- 1. ask ----------------------------------------------------------------------------

    async def _ask(self) -> int:
        async with self.pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                "SELECT a.id, a.ticket_id, a.thread_id, a.owner, a.requester, a.what, "
                "d.name AS device, t.state AS ticket_state "
                "FROM device_approvals a JOIN devices d ON d.id = a.device_id "
                "LEFT JOIN tickets t ON t.id = a.ticket_id "
                "WHERE a.state = 'pending' AND a.asked_at IS NULL "
                "ORDER BY a.created_at LIMIT $1 FOR UPDATE OF a SKIP LOCKED",
                _BATCH,
            )
            for row in rows:
                if row["ticket_state"] in CLOSED_TICKET_STATES:
                    await conn.execute(
                        "UPDATE device_approvals SET state = 'cancelled', decided_at = now(), "
                        "decided_by = 'the ticket closed' WHERE id = $1",
                        row["id"],
                    )
                    continue
                until = await conn.fetchval(
                    "UPDATE device_approvals SET asked_at = now(), "
                    "expires_at = now() + $2::interval WHERE id = $1 RETURNING expires_at",
                    row["id"],
                    self.timeout,
                )
                thread = row["thread_id"] or (
                    await reports.home_thread(conn, row["ticket_id"]) if row["ticket_id"] else None
                )
                if thread is None:
                    log.warning("approvals: %s has no thread to ask %s on", row["id"], row["owner"])
                    continue
                await enqueue_reply(
                    conn,
                    thread,
                    f"For {row['owner']}: {row['requester']} asks to run {row['what']} on your "
                    f"device {row['device']}: reply `approve {row['id']}` or "
                    f"`deny {row['id']}` by {until:%H:%M} UTC (no answer counts as a deny).",
                    stable_id("msg", f"approval:{row['id']}"),
                )
        return len(rows)

    # -- 2. answers ------------------------------------------------------------------------

    async def _answers(self) -> int:
        oldest = await self.pool.fetchval(
            "SELECT min(created_at) FROM device_approvals WHERE state = 'pending'"
        )
        if oldest is None:
            return 0
        done = 0
        for row in await self.pool.fetch(_MAYBE_ANSWERS, oldest):
            found = answers_in(row["text"])
            if not found:  # "apr_" in passing: read once, then left alone
                found = [("none", "-")]
            for verb, approval_id in found:
                try:
                    async with self.pool.acquire() as conn, conn.transaction():
                        await self._decide(conn, row, verb, approval_id)
                except Exception as exc:
                    if is_transient(exc):
                        raise
                    # One bad answer never stops the loop: on record, and left alone.
                    log.exception("approvals: could not read %s as an answer", row["id"])
                    await self._record(
                        self.pool, row["id"], approval_id, verb, "ignored", f"unreadable: {exc}"
                    )
                done += 1
        return done

    async def _record(
        self, conn: Conn | asyncpg.Pool, trigger_id: str, approval_id: str, verb: str, *why: str
    ) -> None:
        outcome, reason = why
        await conn.execute(
            "INSERT INTO approval_answers (trigger_id, approval_id, verb, outcome, reason) "
            "VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
            trigger_id,
            approval_id[:16],
            verb,
            outcome,
            reason,
        )

    async def _decide(
        self, conn: Conn, answer: asyncpg.Record, verb: str, approval_id: str
    ) -> None:
        if verb == "none":
            await self._record(conn, answer["id"], "-", verb, "ignored", "no answer in it")
            return
        approval = await conn.fetchrow(_APPROVAL, approval_id, devices.ADMIN)
        already = await conn.fetchval(
            "SELECT 1 FROM approval_answers WHERE trigger_id = $1 AND approval_id = $2",
            answer["id"],
            approval_id,
        )
        if already:  # another replica read it meanwhile
            return
        who = devices.principals(
            answer["source"],
            answer["actor_id"],
            answer["person"],
            list(answer["actor_groups"] or ()),
        )
        name = answer["person"] or devices.account(answer["source"], answer["actor_id"])
        reason: str | None = None
        if approval is None:
            reason = f"there is no approval {approval_id}"
        elif answer["actor_is_bot"] or answer["source"] not in SOURCES:
            reason = f"{name} is not a person; only {approval['owner']} may answer"
        elif approval["owner"] not in who:
            reason = (
                f"only {approval['owner']}, the owner of {approval['device']}, may answer; "
                f"this came from {name}"
            )
        elif approval["device_owner"] != approval["owner"]:
            reason = f"{approval['device']} is now {approval['device_owner']}'s"
        elif approval["state"] != "pending":
            reason = f"{approval_id} was already {approval['state']}"
        elif approval["late"]:
            reason = f"{approval_id} expired at {approval['expires_at']:%H:%M} UTC"
        if reason is not None:
            log.info("approvals: %s from %s ignored: %s", verb, name, reason)
            await self._record(conn, answer["id"], approval_id, verb, "ignored", reason)
            return
        assert approval is not None
        await self._record(
            conn, answer["id"], approval_id, verb, "accepted", f"{verb} by the owner, {name}"
        )
        state = "approved" if verb == "approve" else "denied"
        await conn.execute(
            "UPDATE device_approvals SET state = $2, decided_at = now(), decided_by = $3, "
            "decision_trigger_id = $4 WHERE id = $1",
            approval_id,
            state,
            name,
            answer["id"],
        )
        if verb == "approve":
            await self._approved(conn, approval, name, answer["id"])
        else:
            ticket = " The ticket is stopped." if approval["ticket_id"] else ""
            await self._refused(
                conn,
                approval,
                "device approval denied",
                f"{name} denied {approval['requester']}'s request to run {approval['what']} "
                f"on {approval['device']}: it does not run.{ticket}",
            )

    async def _approved(
        self, conn: Conn, approval: asyncpg.Record, name: str, trigger_id: str
    ) -> None:
        said: str
        if approval["ticket_id"] is not None:
            grant: dict[str, Any] = {
                "rule": "approved",
                "device_id": approval["device_id"],
                "device": approval["device"],
                "owner": approval["owner"],
                "matched": approval["owner"],
                "requester": approval["requester"],
                "principals": list(approval["principals"]),
                "by": name,
                "answer": trigger_id,
                "approval": approval["id"],
                "at": datetime.now(UTC).isoformat(),
            }
            resume = approval["resume"] or TicketState.OPEN
            moved = await store.device_approved(
                conn,
                approval["ticket_id"],
                approval["device_id"],
                devices.dumps(grant),
                resume=resume,
                device_wait=self.device_wait,
                hold=devices.HOLD,
                approval_id=approval["id"],
            )
            if not moved:
                return  # the ticket moved on meanwhile (stopped, rerouted): nothing to run
            await conn.execute("SELECT pg_notify($1, $2)", Notify.WORKERS, approval["ticket_id"])
            said = f"{name} approved: {approval['what']} runs on {approval['device']}."
        else:
            run = devices.loads(approval["run"]) or {}
            await enqueue(
                conn,
                EffectKind.RUN_COMMAND,
                str(run["trigger_id"]),
                run | {"approval": approval["id"]},
            )
            said = (
                f"{name} approved: running {approval['what']} on {approval['device']} "
                "(the result follows here)."
            )
        await self._say(conn, approval, said)

    async def _refused(self, conn: Conn, approval: asyncpg.Record, hold: str, said: str) -> None:
        if approval["ticket_id"] is not None:
            waiting = await conn.fetchval(
                "SELECT 1 FROM tickets WHERE id = $1 AND state = 'waiting_human' AND hold = $2 "
                "AND device_grant->>'approval' = $3",
                approval["ticket_id"],
                devices.HOLD,
                approval["id"],
            )
            if not waiting:
                return  # the ticket moved on meanwhile: this approval no longer concerns it
            await control.stop(conn, approval["ticket_id"], by=hold)
            await store.set_hold(conn, approval["ticket_id"], hold)
        await self._say(conn, approval, said)

    async def _say(self, conn: Conn, approval: asyncpg.Record, text: str) -> None:
        thread = approval["thread_id"] or (
            await reports.home_thread(conn, approval["ticket_id"])
            if approval["ticket_id"]
            else None
        )
        if thread is not None:
            await enqueue_reply(conn, thread, text, stable_id("msg", f"decided:{approval['id']}"))

    # -- 3. expire -------------------------------------------------------------------------

    async def _expire(self) -> int:
        async with self.pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                "SELECT a.*, d.name AS device FROM device_approvals a "
                "JOIN devices d ON d.id = a.device_id "
                "WHERE a.state = 'pending' AND a.expires_at < now() "
                "ORDER BY a.expires_at LIMIT $1 FOR UPDATE OF a SKIP LOCKED",
                _BATCH,
            )
            for row in rows:
                await conn.execute(
                    "UPDATE device_approvals SET state = 'expired', decided_at = now(), "
                    "decided_by = 'timeout' WHERE id = $1",
                    row["id"],
                )
                handle = _handle(list(row["principals"]))
                ticket = " The ticket is stopped." if row["ticket_id"] else ""
                await self._refused(
                    conn,
                    row,
                    "device approval expired",
                    f"No answer from {row['owner']} by {row['expires_at']:%H:%M} UTC to "
                    f"{row['requester']}'s request to run {row['what']} on {row['device']}, "
                    f"so it does not run.{ticket} To use it without asking, its owner or an "
                    f"admin can run `superagent devices share {row['device']} --with {handle}`.",
                )
        return len(rows)
