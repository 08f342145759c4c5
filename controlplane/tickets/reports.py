"""What a worker's report does to its ticket, and how it reaches people.

``progress`` is only recorded. ``ready``, ``question``, ``blocked`` and ``failed`` end the
round (its slot is freed) and enter the router's inbox as an event on the ticket's home
thread (the thread of the request that started it), so the router, the one voice of the
agent, tells people. A ticket with a pull request waits in ``ready`` until the PR is merged
(completed) or closed without a merge (stopped), woken meanwhile by what happens on it
(:mod:`controlplane.tickets.pr_rounds`, which also ends it ``blocked`` through
:func:`finish_in` when CI keeps failing); one without completes on ready.
question/blocked/failed wait for a human in ``waiting_human``.

A speculative ticket says nothing unless it confirms a reproduction and a fix: then it
becomes an ordinary ticket and delivers; any other final report discards it silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import asyncpg

from controlplane.db.pool import Conn, Db
from controlplane.domain import TicketState
from controlplane.ingest import routing
from controlplane.tickets import mandates, slots, store
from superagent_shared.ids import new_id


@dataclass(frozen=True)
class Spent:
    tokens: int
    cost_usd: Decimal

    def line(self) -> str:
        money = f"${self.cost_usd:.4f}" if self.cost_usd else "no cost (no model prices set)"
        return f"{self.tokens:,} tokens, {money}"


async def spent(db: Db, ticket_id: str) -> Spent:
    row = await db.fetchrow("SELECT tokens_used, cost_usd FROM tickets WHERE id = $1", ticket_id)
    return Spent(0, Decimal(0)) if row is None else Spent(row["tokens_used"], row["cost_usd"])


async def home_thread(db: Db, ticket_id: str) -> str | None:
    """The thread people asked on: the mandate's trigger's, else the first subscribed."""
    found = await db.fetchval(
        "SELECT g.thread_id FROM mandates m JOIN triggers g ON g.id = m.trigger_id "
        "WHERE m.ticket_id = $1 ORDER BY m.created_at LIMIT 1",
        ticket_id,
    )
    if found is None:
        found = await db.fetchval(
            "SELECT thread_id FROM subscriptions WHERE ticket_id = $1 ORDER BY created_at LIMIT 1",
            ticket_id,
        )
    return None if found is None else str(found)


async def record_progress(pool: asyncpg.Pool, ticket_id: str, summary: str) -> None:
    used = await spent(pool, ticket_id)
    await pool.execute(
        "INSERT INTO reports (id, ticket_id, status, summary, tokens, cost_usd) "
        "VALUES ($1, $2, 'progress', $3, $4, $5)",
        new_id("rpt"),
        ticket_id,
        summary,
        used.tokens,
        used.cost_usd,
    )


async def confirm_speculative(pool: asyncpg.Pool, ticket_id: str, summary: str) -> None:
    """A speculative ticket proved its case: from now on it is ordinary, and delivers."""
    async with pool.acquire() as conn, conn.transaction():
        used = await spent(conn, ticket_id)
        await store.confirm_speculative(conn, ticket_id)
        await conn.execute(
            "INSERT INTO reports (id, ticket_id, status, summary, tokens, cost_usd) "
            "VALUES ($1, $2, 'progress', $3, $4, $5)",
            new_id("rpt"),
            ticket_id,
            "confirmed reproduction and fix: " + summary,
            used.tokens,
            used.cost_usd,
        )


def _render(
    ticket_id: str, title: str, report: dict[str, Any], pr_url: str | None, used: Spent
) -> str:
    """The report as the router reads it: what matters first (the router's batch shows
    the first 200 characters inline and the rest behind a recall)."""
    head = [f'{report["status"].upper()}: {ticket_id} "{title[:80]}"']
    if pr_url:
        head.append(f"pull request {pr_url}")
    head.append(used.line())
    lines = [" · ".join(head), f"Summary: {report['summary']}"]
    if report.get("question"):
        lines.append(f"Question: {report['question']}")
    return "\n".join(lines)


async def finish(
    pool: asyncpg.Pool,
    ticket_id: str,
    assignment_id: str | None,
    report: dict[str, Any],
    *,
    to_router: bool = True,
) -> str:
    """Apply a final report (``ready|question|blocked|failed``); returns the ticket's new
    state. The round ends in the same transaction. ``to_router=False``: the caller passes
    the report on itself (the single-session baseline's subagent tool)."""
    async with pool.acquire() as conn, conn.transaction():
        return await finish_in(conn, ticket_id, assignment_id, report, to_router=to_router)


async def finish_in(
    conn: Conn,
    ticket_id: str,
    assignment_id: str | None,
    report: dict[str, Any],
    *,
    to_router: bool = True,
) -> str:
    """:func:`finish` inside the caller's transaction."""
    status = report["status"]
    ticket = await conn.fetchrow(
        "SELECT title, pr_url, speculative FROM tickets WHERE id = $1 FOR UPDATE", ticket_id
    )
    assert ticket is not None
    used = await spent(conn, ticket_id)
    pr_url = report.get("pr_url") or ticket["pr_url"]
    report_id = new_id("rpt")
    if assignment_id is not None:
        await slots.end(conn, assignment_id, status)
    if ticket["speculative"]:
        # Nothing confirmed: discarded without a word to anyone.
        await store.stop(conn, ticket_id, "discarded")
        await mandates.revoke(conn, ticket_id)
        await _insert_report(conn, report_id, ticket_id, assignment_id, report, None, used)
        return TicketState.STOPPED
    if status == "ready":
        state, hold = (TicketState.READY, None) if pr_url else (TicketState.COMPLETED, "ready")
    else:
        state, hold = TicketState.WAITING_HUMAN, status
    await store.finish(conn, ticket_id, state, hold, report.get("pr_url"))
    trigger_id = None
    if to_router:
        trigger_id = await _to_router(
            conn,
            report_id,
            ticket_id,
            _render(ticket_id, ticket["title"], report, pr_url, used),
            f"report.{status}",
        )
    await _insert_report(conn, report_id, ticket_id, assignment_id, report, trigger_id, used)
    return state


async def _insert_report(
    conn: Conn,
    report_id: str,
    ticket_id: str,
    assignment_id: str | None,
    report: dict[str, Any],
    trigger_id: str | None,
    used: Spent,
) -> None:
    await conn.execute(
        "INSERT INTO reports (id, ticket_id, assignment_id, status, summary, question, pr_url, "
        "tokens, cost_usd, trigger_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        report_id,
        ticket_id,
        assignment_id,
        report["status"],
        report["summary"],
        report.get("question"),
        report.get("pr_url"),
        used.tokens,
        used.cost_usd,
        trigger_id,
    )


async def _to_router(
    conn: Conn, report_id: str, ticket_id: str, text: str, kind: str
) -> str | None:
    """The report as an event in the router's inbox, on the ticket's home thread."""
    thread_id = await home_thread(conn, ticket_id)
    if thread_id is None:
        return None
    return await routing.worker_report(
        conn, report_id=report_id, ticket_id=ticket_id, thread_id=thread_id, kind=kind, text=text
    )


async def notice(pool: asyncpg.Pool, ticket_id: str, kind: str, text: str) -> str | None:
    """A notice about a ticket for the router to pass on (no worker report behind it)."""
    async with pool.acquire() as conn, conn.transaction():
        return await _to_router(conn, new_id("rpt"), ticket_id, text, kind)
