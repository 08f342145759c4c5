"""The Costs page: tokens, cache hits and dollars, per day and per ticket.

Read from ``llm_calls`` (one row per model call) joined to their sessions: a worker's
session names its ticket; the router's and the watchdog's do not, and are shown as such.
Over the last :data:`DAYS` days, which the ``created_at`` index keeps cheap.
"""

from __future__ import annotations

from typing import Any

import asyncpg

DAYS = 30
TICKETS = 100

_SUMS = """
count(*) AS calls, count(*) FILTER (WHERE c.error IS NOT NULL) AS errors,
coalesce(sum(c.prompt_tokens), 0) AS prompt_tokens,
coalesce(sum(c.cached_tokens), 0) AS cached_tokens,
coalesce(sum(c.completion_tokens), 0) AS completion_tokens,
coalesce(sum(c.cost_usd), 0) AS cost_usd
"""
_WINDOW = f"c.created_at > now() - interval '{DAYS} days'"


def _with_rate(row: asyncpg.Record) -> dict[str, Any]:
    data = dict(row)
    prompt = data["prompt_tokens"]
    # The share of prompt tokens the provider served from its cache.
    data["cache_hit_rate"] = data["cached_tokens"] / prompt if prompt else None
    return data


async def costs(pool: asyncpg.Pool) -> dict[str, Any]:
    async with pool.acquire() as conn:  # one at a time: the pool also serves the hot paths
        days = await conn.fetch(
            f"SELECT (c.created_at AT TIME ZONE 'UTC')::date AS day, {_SUMS} "
            f"FROM llm_calls c WHERE {_WINDOW} GROUP BY 1 ORDER BY 1 DESC"
        )
        tickets = await conn.fetch(
            f"SELECT s.ticket_id, coalesce(s.kind, 'none') AS session_kind, t.title, t.state, "
            f"{_SUMS} FROM llm_calls c LEFT JOIN sessions s ON s.id = c.session_id "
            f"LEFT JOIN tickets t ON t.id = s.ticket_id WHERE {_WINDOW} "
            "GROUP BY s.ticket_id, 2, t.title, t.state "
            "ORDER BY cost_usd DESC, sum(c.prompt_tokens + c.completion_tokens) DESC "
            f"LIMIT {TICKETS}"
        )
        total = await conn.fetchrow(f"SELECT {_SUMS} FROM llm_calls c WHERE {_WINDOW}")
    assert total is not None
    return {
        "days_covered": DAYS,
        "total": _with_rate(total),
        "per_day": [_with_rate(row) for row in days],
        "per_ticket": [_with_rate(row) for row in tickets],
    }
