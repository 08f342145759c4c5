"""What the watchdog noticed and what it did, on record (``watchdog_findings``,
``watchdog_actions``).

A finding is open while its check keeps seeing it: one row per (kind, subject), its
``times_seen`` counting the passes. A check that no longer sees it resolves it. Actions
hang off findings, so "why was tkt_x stopped?" has an answer in the database.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from controlplane.db.pool import Db
from superagent_shared.ids import new_id


@dataclass(frozen=True)
class Seen:
    """One thing a check sees this pass."""

    kind: str
    subject: str
    severity: str
    summary: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Open:
    """An open finding as recorded: how long it has been seen, what was done about it."""

    id: str
    kind: str
    subject: str
    severity: str
    summary: str
    times_seen: int
    first_seen_at: datetime
    actions: tuple[str, ...]


async def record(pool: asyncpg.Pool, kind: str, seen: Iterable[Seen]) -> list[Open]:
    """This pass's view of one kind: open or bump what is seen, resolve what is not."""
    items = list(seen)
    rows = await pool.fetch(
        """
        WITH seen AS (
            SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
                AS s(id, subject, severity, summary, details)
        ), resolved AS (
            UPDATE watchdog_findings SET resolved_at = now()
            WHERE kind = $1 AND resolved_at IS NULL
              AND subject NOT IN (SELECT subject FROM seen)
        ), upserted AS (
            INSERT INTO watchdog_findings (id, kind, subject, severity, summary, details)
            SELECT id, $1, subject, severity, summary, details::jsonb FROM seen
            ON CONFLICT (kind, subject) WHERE resolved_at IS NULL DO UPDATE SET
                times_seen = watchdog_findings.times_seen + 1, last_seen_at = now(),
                severity = EXCLUDED.severity, summary = EXCLUDED.summary,
                details = EXCLUDED.details
            RETURNING id, kind, subject, severity, summary, times_seen, first_seen_at
        )
        SELECT u.*, coalesce(
            (SELECT array_agg(a.action ORDER BY a.created_at) FROM watchdog_actions a
             WHERE a.finding_id = u.id), '{}') AS actions
        FROM upserted u
        """,
        kind,
        [new_id("wfd") for _ in items],
        [s.subject for s in items],
        [s.severity for s in items],
        [s.summary for s in items],
        [json.dumps(s.details, default=str) for s in items],
    )
    return [
        Open(
            id=row["id"],
            kind=row["kind"],
            subject=row["subject"],
            severity=row["severity"],
            summary=row["summary"],
            times_seen=row["times_seen"],
            first_seen_at=row["first_seen_at"],
            actions=tuple(row["actions"]),
        )
        for row in rows
    ]


async def acted(db: Db, finding_id: str, action: str, detail: str = "") -> None:
    await db.execute(
        "INSERT INTO watchdog_actions (id, finding_id, action, detail) VALUES ($1, $2, $3, $4)",
        new_id("wac"),
        finding_id,
        action,
        detail[:4000],
    )


async def open_findings(db: Db, subject: str | None = None) -> list[asyncpg.Record]:
    """Open findings (of one subject), most severe and oldest first, with their actions."""
    return await db.fetch(
        "SELECT f.id, f.kind, f.subject, f.severity, f.summary, f.times_seen, "
        "f.first_seen_at, f.last_seen_at, "
        "coalesce((SELECT array_agg(a.action || coalesce(': ' || nullif(a.detail, ''), '') "
        "  ORDER BY a.created_at) FROM watchdog_actions a WHERE a.finding_id = f.id), '{}') "
        "  AS actions "
        "FROM watchdog_findings f WHERE f.resolved_at IS NULL "
        "AND ($1::text IS NULL OR f.subject = $1) "
        "ORDER BY CASE f.severity WHEN 'critical' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END, "
        "f.first_seen_at",
        subject,
    )
