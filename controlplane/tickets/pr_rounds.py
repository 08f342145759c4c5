"""Rounds of a ticket whose pull request is open: which events start one, and the caps on
those nobody asked for.

A ticket waits in ``ready`` while its pull request is open; what happens on the pull
request's threads reaches its inbox (pass-through) and decides here whether a round starts:

* an event from a person (a comment, a review, a review comment) starts one, and starts the
  counts below over;
* a failed CI result (check run, check suite or workflow run that failed, timed out, was
  cancelled...) starts an automatic fix round, at most ``workers.ci_fix_rounds_limit``
  since a person last spoke. One more failure ends the ticket ``blocked`` through the
  normal report path, naming the check ("CI check 'tests' failed 4 times; 3 automatic fix
  rounds used"): the router tells people;
* bot events (a review bot, not CI) start at most ``workers.bot_rounds_limit`` rounds in a
  row. Past it they are kept for the worker to read when something else wakes it, the
  ticket shows hold ``bot loop: waiting for a person``, and the thread is told once;
* a CI result that passed (or needs no fix) and a push to the branch
  (``pull_request.synchronize``, usually the worker's own) start nothing and count for
  nothing; they wait in the inbox.

"A person" is a human account's event that is not CI output and not a push notice:
whatever account sent a CI result, it is CI's output (as :mod:`.authority` marks it).
The counts live on the ticket (``ci_fix_rounds``, ``bot_rounds``, since ``loop_since``);
a person's event in the ticket's inbox newer than ``loop_since``, read or not, starts them
over, and so does a person (or a retry) waking the ticket after a block. Whether a CI
result passed, and whether a closed pull request was merged, is read from GitHub's verdict
where the GitHub adapter writes it (:mod:`.pr_events`), never from people's words.

The merge or close of the ticket's own pull request is not a round's business: it ends
the ticket (:func:`end_closed`), merged ``completed``, closed without a merge ``stopped``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import asyncpg

from controlplane.db.pool import Conn, Db
from controlplane.domain import TicketState, sql_list
from controlplane.gateway import authorization as access
from controlplane.ingest import inbox
from controlplane.ingest.inbox import IS_STOP
from controlplane.replies import enqueue_reply
from controlplane.settings import WorkerSettings
from controlplane.tickets import events, mandates, pr_events, reports, store
from controlplane.tickets.authority import CI_KINDS
from superagent_shared.ids import stable_id

BOT_HOLD = "bot loop: waiting for a person"
# Events about the pull request's state, not anyone's words (GitHub sends a push to the
# branch as its pusher, often the device's owner): they never wake nor count as a person.
NOTICE_KINDS = ("pull_request.synchronize",)

# SQL over triggers aliased ``g``.
_CI = f"split_part(g.kind, '.', 1) IN ({sql_list(sorted(CI_KINDS))})"
_NO_FIX = f"split_part(g.text, ':', 1) IN ({sql_list(map(pr_events.ci_verdict, pr_events.NO_FIX))})"
_NOTICE = f"g.kind IN ({sql_list(NOTICE_KINDS)})"
CI_FAILED = f"({_CI} AND NOT {_NO_FIX})"
PERSON = f"(NOT g.actor_is_bot AND NOT {_CI} AND NOT {_NOTICE})"
BOT = f"(g.actor_is_bot AND NOT {_CI} AND NOT {_NOTICE})"

# Unread events of the ticket a round would read: not handed back, not a /stop (carried out
# by the worker service), not the close of its own pull request (that ends the ticket).
_UNREAD = f"""
i.ticket_id = t.id AND i.read_at IS NULL AND i.handed_back_at IS NULL AND NOT {IS_STOP}
AND NOT (g.kind = 'pull_request.closed' AND th.url IS NOT DISTINCT FROM t.pr_url)
"""

# Ready tickets with events that may start a round. Bots past the cap are left out once the
# ticket shows it, so that a held ticket is not looked at again every pass.
_PENDING = f"""
SELECT t.id, t.ci_fix_rounds, t.bot_rounds, t.loop_since, e.person, e.ci_failed, e.bots,
       (SELECT max(g.created_at) FROM ticket_inbox i JOIN triggers g ON g.id = i.trigger_id
        WHERE i.ticket_id = t.id AND i.handed_back_at IS NULL AND {PERSON}
          AND g.created_at > coalesce(t.loop_since, '-infinity'::timestamptz)) AS person_at
FROM tickets t
JOIN LATERAL (
    SELECT coalesce(bool_or({PERSON}), false) AS person,
           count(*) FILTER (WHERE {CI_FAILED}) AS ci_failed,
           count(*) FILTER (WHERE {BOT}) AS bots
    FROM ticket_inbox i JOIN triggers g ON g.id = i.trigger_id
    JOIN threads th ON th.id = g.thread_id
    WHERE {_UNREAD}
) e ON true
WHERE t.state = 'ready'
  AND (e.person OR e.ci_failed > 0
       OR (e.bots > 0 AND (t.bot_rounds < $1 OR t.hold IS DISTINCT FROM '{BOT_HOLD}')))
LIMIT 100
"""


@dataclass(frozen=True)
class Decision:
    """What a ready ticket's unread events call for."""

    ticket_id: str
    action: Literal["wake", "block", "hold"]
    person: bool = False  # a person's event: the round may use the human slot
    ci: bool = False  # the round counts as an automatic CI fix round
    bot: bool = False  # the round counts as a bot round
    person_at: datetime | None = None  # a person spoke at: the counts start over
    rounds: int = 0  # the fix rounds (block) or bot rounds (hold) used


def decide(row: Mapping[str, Any] | asyncpg.Record, limits: WorkerSettings) -> Decision | None:
    """The decision for one row of the pending query (None: nothing to do)."""
    ticket_id: str = row["id"]
    person_at: datetime | None = row["person_at"]
    fresh = person_at is not None
    ci_used = 0 if fresh else int(row["ci_fix_rounds"])
    bot_used = 0 if fresh else int(row["bot_rounds"])
    failed, bots = int(row["ci_failed"]), int(row["bots"])
    if row["person"]:
        return Decision(ticket_id, "wake", person=True, person_at=person_at)
    if failed:
        if ci_used < limits.ci_fix_rounds_limit:
            return Decision(ticket_id, "wake", ci=True, bot=bots > 0, person_at=person_at)
        return Decision(ticket_id, "block", rounds=ci_used)
    if bots:
        if bot_used < limits.bot_rounds_limit:
            return Decision(ticket_id, "wake", bot=True, person_at=person_at)
        return Decision(ticket_id, "hold", rounds=bot_used)
    return None


async def pending(db: Db, limits: WorkerSettings) -> list[Decision]:
    """The decisions for every ready ticket whose unread events call for one."""
    rows = await db.fetch(_PENDING, limits.bot_rounds_limit)
    return [d for d in (decide(row, limits) for row in rows) if d is not None]


async def started(conn: Conn, decision: Decision) -> None:
    """The round ``decision`` asked for started: count it (after the start committed; a
    crash in between spares one round, it never blocks one too early)."""
    if decision.person_at is not None:
        await store.people_stepped_in(conn, decision.ticket_id, decision.person_at)
    if decision.ci or decision.bot:
        await store.count_unasked_round(conn, decision.ticket_id, ci=decision.ci, bot=decision.bot)


async def people_woke(conn: Conn, ticket_id: str) -> None:
    """A person (or a retry) woke the ticket from waiting for people: counts start over."""
    await store.people_stepped_in(conn, ticket_id)


# -- a failed CI past the cap ---------------------------------------------------------------


def _times(n: int) -> str:
    return {1: "once", 2: "twice"}.get(n, f"{n} times")


# The most telling of the results one failure sends (a run, then its workflow, then suite).
_SPECIFIC = ("check_run", "workflow_run", "workflow_job", "check_suite", "status")


async def ci_summary(conn: Conn, ticket_id: str, since: datetime | None, rounds: int) -> str:
    """What a block says, e.g. ``CI check 'tests' failed 4 times; 3 automatic fix rounds
    used``: the checks whose failure is unread, each with its failures since people last
    spoke."""
    rows = await conn.fetch(
        "SELECT split_part(g.kind, '.', 1) AS event, g.text, i.read_at IS NULL AS unread "
        "FROM ticket_inbox i JOIN triggers g ON g.id = i.trigger_id "
        f"WHERE i.ticket_id = $1 AND i.handed_back_at IS NULL AND {CI_FAILED} "
        "AND g.created_at > coalesce($2::timestamptz, '-infinity'::timestamptz) "
        "ORDER BY g.created_at, g.id",
        ticket_id,
        since,
    )
    failed = [(row["event"], pr_events.check_of(row["text"]), row["unread"]) for row in rows]
    failures = Counter((event, check) for event, check, _ in failed)
    # The failures that called for this (unread); all of them if those were read meanwhile.
    latest = [(event, check) for event, check, unread in failed if unread] or list(failures)
    kind = min((event for event, _ in latest), key=_rank, default="")
    now = list(dict.fromkeys(check for event, check in latest if event == kind)) or ["CI"]
    used = f"{rounds} automatic fix round{'' if rounds == 1 else 's'} used"
    if len(now) == 1:
        return f"CI check '{now[0]}' failed {_times(failures[(kind, now[0])])}; {used}"
    named = ", ".join(f"'{check}' ({_times(failures[(kind, check)])})" for check in now)
    return f"CI checks {named} failed; {used}"


def _rank(event: str) -> int:
    return _SPECIFIC.index(event) if event in _SPECIFIC else len(_SPECIFIC)


async def block(pool: asyncpg.Pool, decision: Decision) -> str | None:
    """End the ticket ``blocked`` with a report naming the failing check (the router tells
    people), and leave the worker a notice for when a person wakes it. Returns the summary,
    or None if the ticket was no longer ready."""
    async with pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(
            "SELECT state, loop_since FROM tickets WHERE id = $1 FOR UPDATE", decision.ticket_id
        )
        if row is None or row["state"] != TicketState.READY:
            return None
        summary = await ci_summary(conn, decision.ticket_id, row["loop_since"], decision.rounds)
        await reports.finish_in(
            conn, decision.ticket_id, None, {"status": "blocked", "summary": summary}
        )
        await events.add(
            conn,
            decision.ticket_id,
            "ci_limit",
            f"{summary} (workers.ci_fix_rounds_limit): you were not woken for the last "
            "failure, and the ticket waits for a person.",
        )
    return summary


# -- bots past the cap ---------------------------------------------------------------------


async def hold_bots(pool: asyncpg.Pool, decision: Decision) -> bool:
    """Bot events wake the ticket no more: it shows why, and the thread the latest bot
    spoke on is told, once per series. False if the ticket already showed it."""
    async with pool.acquire() as conn, conn.transaction():
        if not await store.hold_ready(conn, decision.ticket_id, BOT_HOLD):
            return False
        row = await conn.fetchrow(
            "SELECT g.thread_id, t.loop_since FROM tickets t "
            "JOIN ticket_inbox i ON i.ticket_id = t.id JOIN triggers g ON g.id = i.trigger_id "
            f"WHERE t.id = $1 AND i.read_at IS NULL AND i.handed_back_at IS NULL AND {BOT} "
            "ORDER BY g.created_at DESC LIMIT 1",
            decision.ticket_id,
        )
        said = (
            f"{decision.ticket_id} stops answering bots here: {decision.rounds} rounds in a "
            "row were started by bot events with no person in between "
            "(workers.bot_rounds_limit). Their events are kept for it; a comment from a "
            "person wakes it again."
        )
        await events.add(conn, decision.ticket_id, "bot_loop", said)
        if row is not None:
            await enqueue_reply(
                conn,
                row["thread_id"],
                said,
                stable_id("msg", f"bot-loop:{decision.ticket_id}:{row['loop_since']}"),
            )
    return True


# -- the pull request closes ---------------------------------------------------------------


async def end_closed(conn: Conn) -> list[asyncpg.Record]:
    """End the tickets whose pull request closed (rows: id, state). One closed without a
    merge is stopped like any stop: its mandate revoked, its device approvals cancelled (its
    device work is cancelled by the worker service's housekeeping). What their inboxes
    still hold is read."""
    rows = await store.end_closed_pull_requests(conn)
    await inbox.read_all(conn, [row["id"] for row in rows])
    for row in rows:
        if row["state"] == TicketState.STOPPED:
            await mandates.revoke(conn, row["id"])
            await access.cancel_pending(conn, row["id"], by="its pull request was closed")
    return rows
