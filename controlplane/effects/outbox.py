"""Writing effects, inside the transaction that decided them.

Enqueueing is an upsert on (kind, key): enqueueing the same key again replaces the payload
and bumps the generation, so a runner still executing the old version will not delete the
new one. A claimed effect keeps its lease when updated: the new version runs after the old
execution finishes, never beside it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from superagent_shared.ids import new_id

NOTIFY_CHANNEL = "superagent_effects"

# One round trip: the upsert and the wake-up. Postgres folds identical notifications in one
# transaction into one, so a transaction that enqueues many effects wakes runners once, and
# only after it commits.
_ENQUEUE = f"""
WITH up AS (
    INSERT INTO effects (id, kind, key, payload, next_attempt_at)
    VALUES ($1, $2, $3, CAST($4 AS jsonb), now() + CAST($5 AS interval))
    ON CONFLICT (kind, key) DO UPDATE SET
        payload = excluded.payload,
        generation = effects.generation + 1,
        attempts = 0,
        last_error = NULL,
        dead_at = NULL,
        next_attempt_at = CASE WHEN effects.locked_by IS NULL
                               THEN excluded.next_attempt_at
                               ELSE effects.next_attempt_at END
    RETURNING id, generation
), wake AS (SELECT pg_notify('{NOTIFY_CHANNEL}', '') AS n)
SELECT up.id, up.generation FROM up, wake
"""
# The same statement for SQLAlchemy, whose text() binds by name.
_ENQUEUE_NAMED = text(re.sub(r"\$(\d)", r":p\1", _ENQUEUE))


@dataclass(frozen=True, slots=True)
class EffectRef:
    id: str
    generation: int


async def enqueue(
    conn: asyncpg.Connection,
    kind: str,
    key: str,
    payload: dict[str, Any],
    *,
    delay: float = 0.0,
) -> EffectRef:
    """Upsert an effect on a raw asyncpg connection (in its current transaction, if any)."""
    row = await conn.fetchrow(
        _ENQUEUE, new_id("eff"), kind, key, json.dumps(payload), timedelta(seconds=delay)
    )
    assert row is not None
    return EffectRef(row["id"], row["generation"])


async def enqueue_in(
    session: AsyncSession,
    kind: str,
    key: str,
    payload: dict[str, Any],
    *,
    delay: float = 0.0,
) -> EffectRef:
    """Upsert an effect in a SQLAlchemy session's transaction (the usual domain-code path)."""
    result = await session.execute(
        _ENQUEUE_NAMED,
        {
            "p1": new_id("eff"),
            "p2": kind,
            "p3": key,
            "p4": json.dumps(payload),
            "p5": timedelta(seconds=delay),
        },
    )
    row = result.one()
    return EffectRef(row.id, row.generation)
