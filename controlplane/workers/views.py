"""Tickets as people look at them (``superagent tickets``): what, where, how far, at what cost."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import asyncpg

from controlplane.domain import CLOSED_TICKET_SQL, from_iso
from controlplane.errors import NotFound
from controlplane.gateway import authorization as access


@dataclass(frozen=True)
class TicketView:
    id: str
    title: str
    state: str
    hold: str | None
    device: str | None
    speculative: bool
    pr_url: str | None
    tokens: int
    cost_usd: Decimal
    wait_until: datetime | None
    updated_at: datetime
    initiator: str | None
    # Why the requester may use the device (controlplane.gateway.authorization): rule, match, when.
    device_grant: dict[str, Any] | None = None
    # Rounds failed in a row, why the last failed, when the next may start
    # (controlplane.tickets.retries).
    failed_rounds: int = 0
    last_error: str | None = None
    retry_at: datetime | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "state": self.state,
            "hold": self.hold,
            "device": self.device,
            "speculative": self.speculative,
            "pull_request": self.pr_url,
            "tokens": self.tokens,
            "cost_usd": str(self.cost_usd),
            "wait_until": self.wait_until.isoformat() if self.wait_until else None,
            "updated_at": self.updated_at.isoformat(),
            "initiator": self.initiator,
            "device_grant": self.device_grant,
            "failed_rounds": self.failed_rounds,
            "last_error": self.last_error,
            "retry_at": self.retry_at.isoformat() if self.retry_at else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TicketView:
        """The view :meth:`as_json` made (a deployment's answer over HTTP)."""
        return cls(
            id=data["id"],
            title=data["title"],
            state=data["state"],
            hold=data["hold"],
            device=data["device"],
            speculative=data["speculative"],
            pr_url=data["pull_request"],
            tokens=data["tokens"],
            cost_usd=Decimal(data["cost_usd"]),
            wait_until=from_iso(data["wait_until"]),
            updated_at=datetime.fromisoformat(data["updated_at"]),
            initiator=data["initiator"],
            device_grant=data["device_grant"],
            failed_rounds=data["failed_rounds"],
            last_error=data["last_error"],
            retry_at=from_iso(data["retry_at"]),
        )


_SELECT = """
SELECT t.id, t.title, t.state, t.hold, d.name AS device, t.speculative, t.pr_url,
       t.tokens_used AS tokens, t.cost_usd, t.wait_until, t.updated_at,
       (SELECT initiator_name FROM mandates m WHERE m.ticket_id = t.id
        ORDER BY m.created_at LIMIT 1) AS initiator, t.device_grant,
       t.failed_rounds, t.last_error, t.retry_at
FROM tickets t LEFT JOIN devices d ON d.id = t.device_id
"""


def _view(row: asyncpg.Record) -> TicketView:
    return TicketView(**(dict(row) | {"device_grant": access.loads(row["device_grant"])}))


def describe_grant(grant: dict[str, Any]) -> str:
    """A ticket's device check in one line, for people."""
    rule, at = grant.get("rule"), str(grant.get("at"))[:16]
    if rule == access.PENDING:
        return (
            f"waits for {grant.get('owner')} to approve {grant.get('approval')} "
            f"(for {grant.get('requester')}, since {at})"
        )
    detail = {
        "owner": f"{grant.get('matched')} owns {grant.get('device')}",
        "delegated": f"shared with {grant.get('matched')}",
        "shared": f"shared with {grant.get('matched')}",
        "approved": f"{grant.get('owner')} approved {grant.get('approval')}",
    }.get(str(rule), str(grant.get("matched")))
    return f"{rule}: {detail} (for {grant.get('requester')}; {grant.get('by')}, {at})"


async def tickets(
    pool: asyncpg.Pool, *, everything: bool = False, limit: int = 50
) -> list[TicketView]:
    """Open tickets, newest first (``everything``: closed ones too)."""
    where = "" if everything else f"WHERE t.state NOT IN ({CLOSED_TICKET_SQL}) "
    rows = await pool.fetch(f"{_SELECT}{where}ORDER BY t.created_at DESC LIMIT $1", limit)
    return [_view(row) for row in rows]


@dataclass(frozen=True)
class TicketDetail:
    ticket: TicketView
    scope: str | None
    threads: list[str]
    reports: list[dict[str, Any]]
    rounds: list[dict[str, Any]]

    def as_json(self) -> dict[str, Any]:
        return {
            **self.ticket.as_json(),
            "scope": self.scope,
            "threads": self.threads,
            "reports": self.reports,
            "rounds": self.rounds,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TicketDetail:
        """The console's ticket (its threads with their titles and relations), as
        ``superagent tickets show`` lists it: the threads the ticket handles."""
        threads = [
            t if isinstance(t, str) else (t.get("url") or f"{t['source']} {t['external_id']}")
            for t in data["threads"]
            if isinstance(t, str) or t.get("relation", "handles") == "handles"
        ]
        return cls(
            ticket=TicketView.from_json(data),
            scope=data["scope"],
            threads=threads,
            reports=data["reports"],
            rounds=data["rounds"],
        )


async def detail(pool: asyncpg.Pool, ticket_id: str) -> TicketDetail:
    row = await pool.fetchrow(f"{_SELECT}WHERE t.id = $1", ticket_id)
    if row is None:
        raise NotFound(f"no ticket {ticket_id} (see `superagent tickets list --all`)")
    scope = await pool.fetchval(
        "SELECT scope FROM mandates WHERE ticket_id = $1 ORDER BY created_at LIMIT 1", ticket_id
    )
    threads = await pool.fetch(
        "SELECT th.source, th.external_id, th.url FROM subscriptions s "
        "JOIN threads th ON th.id = s.thread_id WHERE s.ticket_id = $1 ORDER BY s.created_at",
        ticket_id,
    )
    reports = await pool.fetch(
        "SELECT status, summary, question, created_at FROM reports WHERE ticket_id = $1 "
        "ORDER BY created_at",
        ticket_id,
    )
    rounds = await pool.fetch(
        "SELECT id, slot, woken_by, turns, outcome, created_at, ended_at FROM assignments "
        "WHERE ticket_id = $1 ORDER BY created_at",
        ticket_id,
    )
    return TicketDetail(
        ticket=_view(row),
        scope=scope,
        threads=[r["url"] or f"{r['source']} {r['external_id']}" for r in threads],
        reports=[
            {
                "status": r["status"],
                "summary": r["summary"],
                "question": r["question"],
                "at": r["created_at"].isoformat(),
            }
            for r in reports
        ],
        rounds=[
            {
                "id": r["id"],
                "slot": r["slot"],
                "woken_by": r["woken_by"],
                "model_calls": r["turns"],
                "outcome": r["outcome"] or ("running" if r["ended_at"] is None else ""),
                "started": r["created_at"].isoformat(),
            }
            for r in rounds
        ],
    )
