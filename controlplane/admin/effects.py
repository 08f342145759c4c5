"""The outbox: its effects, and running a dead one again (``superagent effects``)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from controlplane.admin.ops import Caller, Params, operation
from controlplane.effects import outbox


class Listing(Params):
    dead: bool = False
    limit: Annotated[int, Field(ge=0, le=10_000)] = 50


@operation("effects.list", Listing)
async def listing(caller: Caller, params: Listing) -> list[dict[str, Any]]:
    """Effects in the outbox, oldest first: waiting, retrying, or dead."""
    rows = await caller.pool.fetch(
        "SELECT id, kind, key, attempts, last_error, dead_at, next_attempt_at, created_at "
        "FROM effects WHERE $1::bool IS FALSE OR dead_at IS NOT NULL "
        "ORDER BY created_at, id LIMIT $2",
        params.dead,
        params.limit,
    )
    return [dict(row) for row in rows]


class One(Params):
    effect: Annotated[str, Field(max_length=100)]


@operation("effects.retry", One)
async def retry(caller: Caller, params: One) -> dict[str, Any]:
    """A dead effect runs again, from its first attempt."""
    await outbox.revive(caller.pool, params.effect)
    return {"effect": params.effect, "retried": True}
