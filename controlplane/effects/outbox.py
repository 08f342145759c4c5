"""Writing effects, inside the transaction that decided them.

Enqueueing is an upsert on (kind, key): enqueueing the same key again replaces the payload
and bumps the generation, so a runner still executing the old version will not delete the
new one. A claimed effect keeps its lease when updated: the new version runs after the old
execution finishes, never beside it. A dead effect goes back in the outbox only when an
admin asks (:func:`revive`). With the runner (:mod:`.runner`, which claims, completes and
fails them), the one writer of ``effects``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import asyncpg

from controlplane.db.pool import Conn
from controlplane.domain import Notify
from controlplane.errors import InvalidInput, NotFound
from superagent_shared.ids import new_id, new_ids

# One round trip: the upsert and the wake-up. Postgres folds identical notifications in one
# transaction into one, so a transaction that enqueues many effects wakes runners once, and
# only after it commits.
_ENQUEUE = f"""
WITH up AS (
    INSERT INTO effects (id, kind, key, payload, next_attempt_at)
    VALUES ($1, $2, $3, CAST(CAST($4 AS text) AS jsonb), now() + CAST($5 AS interval))
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
), wake AS (SELECT pg_notify('{Notify.EFFECTS}', '') AS n)
SELECT up.id, up.generation FROM up, wake
"""

# Many effects in one statement: the same upsert over unnest(), and one wake-up.
_ENQUEUE_MANY = f"""
WITH up AS (
    INSERT INTO effects (id, kind, key, payload, next_attempt_at)
    SELECT i.id, i.kind, i.key, CAST(i.payload AS jsonb), now() + CAST($5 AS interval)
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS i(id, kind, key, payload)
    ON CONFLICT (kind, key) DO UPDATE SET
        payload = excluded.payload,
        generation = effects.generation + 1,
        attempts = 0,
        last_error = NULL,
        dead_at = NULL,
        next_attempt_at = CASE WHEN effects.locked_by IS NULL
                               THEN excluded.next_attempt_at
                               ELSE effects.next_attempt_at END
    RETURNING id, kind, key, generation
), wake AS (SELECT pg_notify('{Notify.EFFECTS}', '') AS n)
SELECT up.id, up.kind, up.key, up.generation FROM up, wake
"""


@dataclass(frozen=True, slots=True)
class EffectRef:
    id: str
    generation: int


async def enqueue(
    conn: Conn,
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


async def enqueue_many(
    conn: Conn,
    effects: Iterable[tuple[str, str, dict[str, Any]]],
    *,
    delay: float = 0.0,
) -> list[EffectRef]:
    """Upsert many ``(kind, key, payload)`` effects in one round trip (and one wake-up).

    The same as calling :func:`enqueue` for each, in order, except that a ``(kind, key)``
    given twice is written once, with its last payload. Returns one ref per input, in order.
    """
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    order: list[tuple[str, str]] = []
    for kind, key, payload in effects:
        order.append((kind, key))
        latest[(kind, key)] = payload
    if not latest:
        return []
    pairs = sorted(latest)  # one lock order for every caller: no deadlock between batches
    rows = await conn.fetch(
        _ENQUEUE_MANY,
        new_ids("eff", len(pairs)),
        [kind for kind, _ in pairs],
        [key for _, key in pairs],
        [json.dumps(latest[pair]) for pair in pairs],
        timedelta(seconds=delay),
    )
    refs = {(row["kind"], row["key"]): EffectRef(row["id"], row["generation"]) for row in rows}
    return [refs[pair] for pair in order]


async def revive(pool: asyncpg.Pool, effect_id: str) -> None:
    """Run a dead effect again, from its first attempt, at once."""
    async with pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow("SELECT dead_at FROM effects WHERE id = $1", effect_id)
        if row is None:
            raise NotFound(f"no effect {effect_id} (it may have run and been removed)")
        if row["dead_at"] is None:
            raise InvalidInput(f"{effect_id} is not dead; it runs by itself")
        await conn.execute(
            "UPDATE effects SET dead_at = NULL, attempts = 0, last_error = NULL, "
            "locked_by = NULL, next_attempt_at = now() WHERE id = $1",
            effect_id,
        )
        await conn.execute("SELECT pg_notify($1, $2)", Notify.EFFECTS, effect_id)
