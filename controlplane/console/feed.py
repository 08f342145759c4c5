"""The Trigger feed: every event that came in, newest first, with the policy's verdict on
it, why, and where ingest sent it (the router, the subscribed tickets, or nowhere); for
the router's, what it decided and each call its turns made, refused ones with why
(:mod:`controlplane.router.record`), and a failing or set-aside event's reason."""

from __future__ import annotations

from typing import Any, get_args

import asyncpg

from controlplane.db.models import TRIGGER_ROUTES
from controlplane.errors import InvalidInput
from controlplane.ingest.admission import VerdictKind
from controlplane.ingest.routing import REPORT_VERDICT
from controlplane.router import record

LIMIT = 100
TEXT_CHARS = 500
VERDICTS = (*get_args(VerdictKind), REPORT_VERDICT)
SOURCE_CHARS = 50


def _one_of(name: str, value: str | None, allowed: tuple[str, ...]) -> str | None:
    if not value:
        return None
    if value not in allowed:
        raise InvalidInput(f"{name} must be one of {', '.join(allowed)}, not {value!r}")
    return value


async def feed(
    pool: asyncpg.Pool,
    *,
    verdict: str | None = None,
    route: str | None = None,
    source: str | None = None,
) -> dict[str, Any]:
    verdict = _one_of("verdict", verdict, VERDICTS)
    route = _one_of("route", route, TRIGGER_ROUTES)
    source = (source or "").strip() or None
    if source is not None and len(source) > SOURCE_CHARS:
        raise InvalidInput(f"source is at most {SOURCE_CHARS} characters")
    rows = await pool.fetch(
        f"""
        SELECT g.id, g.source, g.kind, g.actor_name, g.actor_is_bot, g.verdict,
               g.verdict_reason, g.route, g.created_at, g.routed_at,
               left(g.text, {TEXT_CHARS}) AS text, length(g.text) > {TEXT_CHARS} AS cut,
               th.title AS thread_title, th.url AS thread_url, th.external_id AS thread,
               g.undecidable_at, g.route_attempts, g.route_error,
               {record.CALLS_JSON} AS calls
        FROM triggers g JOIN threads th ON th.id = g.thread_id
        WHERE ($1::text IS NULL OR g.verdict = $1)
          AND ($2::text IS NULL OR g.route = $2)
          AND ($3::text IS NULL OR g.source = $3)
        ORDER BY g.created_at DESC LIMIT {LIMIT}
        """,
        verdict,
        route,
        source,
    )
    return {
        "filters": {"verdict": verdict, "route": route, "source": source},
        "options": {"verdict": list(VERDICTS), "route": list(TRIGGER_ROUTES)},
        "triggers": [
            {**dict(row), "decision": record.decision(row["calls"])} if row["calls"] else dict(row)
            for row in rows
        ],
    }
