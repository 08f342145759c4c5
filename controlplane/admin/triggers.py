"""The router's inbox: events waiting for it, the ones it set aside as undecidable, one
event with what its turns did, and putting one back (``superagent triggers``)."""

from __future__ import annotations

from typing import Annotated, Any

import asyncpg
from pydantic import Field

from controlplane.admin.ops import Caller, Params, operation
from controlplane.errors import InvalidInput, NotFound
from controlplane.ingest import routing
from controlplane.router import record
from superagent_shared.ids import id_prefix

_COLUMNS = (
    "t.id, t.source, t.thread_id, th.external_id AS thread, t.actor_name, t.kind, t.verdict, "
    "t.route, t.text, t.created_at, t.routed_at, t.undecidable_at, t.route_attempts, "
    "t.route_error, t.model_notice_at"
)


def state(row: asyncpg.Record) -> str:
    if row["undecidable_at"] is not None:
        return "undecidable"
    if row["routed_at"] is None:
        return "waiting" if row["route_attempts"] == 0 else f"failing ({row['route_attempts']})"
    return "routed"


def _shown(row: asyncpg.Record) -> dict[str, Any]:
    return {"state": state(row), **dict(row)}


def checked(trigger_id: str) -> str:
    if id_prefix(trigger_id) != "trg":
        raise InvalidInput(f"{trigger_id!r} is not a trigger id (trg_ and 12 characters)")
    return trigger_id


class Listing(Params):
    undecidable: bool = False
    limit: Annotated[int, Field(ge=0, le=10_000)] = 50


@operation("triggers.list", Listing)
async def listing(caller: Caller, params: Listing) -> list[dict[str, Any]]:
    """Events waiting for the router and those set aside as undecidable, oldest first."""
    where = (
        "t.undecidable_at IS NOT NULL"
        if params.undecidable
        else "(t.routed_at IS NULL OR t.undecidable_at IS NOT NULL)"
    )
    rows = await caller.pool.fetch(
        f"SELECT {_COLUMNS} FROM triggers t JOIN threads th ON th.id = t.thread_id "
        f"WHERE {where} ORDER BY t.created_at, t.id LIMIT $1",
        params.limit,
    )
    return [_shown(row) for row in rows]


class One(Params):
    trigger: Annotated[str, Field(max_length=100)]


@operation("triggers.show", One)
async def show(caller: Caller, params: One) -> dict[str, Any]:
    """One event: its thread, text and state, each failed turn, the calls its turns made."""
    pool, trigger_id = caller.pool, checked(params.trigger)
    row = await pool.fetchrow(
        f"SELECT {_COLUMNS} FROM triggers t JOIN threads th ON th.id = t.thread_id WHERE t.id = $1",
        trigger_id,
    )
    if row is None:
        raise NotFound(f"no trigger {trigger_id}")
    failed = await pool.fetch(
        "SELECT error_class, error, quarantined, created_at FROM item_failures "
        "WHERE loop = 'router' AND item_id = $1 ORDER BY created_at, id",
        trigger_id,
    )
    calls = await record.calls(pool, trigger_id)
    return {
        **_shown(row),
        "failures": [dict(f) for f in failed],
        "decision": record.decision(calls),
        "calls": calls,
    }


@operation("triggers.retry", One)
async def retry(caller: Caller, params: One) -> dict[str, Any]:
    """An undecidable event back in the router's inbox, its failures forgotten."""
    trigger_id = checked(params.trigger)
    async with caller.pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(
            "SELECT undecidable_at FROM triggers WHERE id = $1 FOR UPDATE", trigger_id
        )
        if row is None:
            raise NotFound(f"no trigger {trigger_id}")
        if row["undecidable_at"] is None:
            raise InvalidInput(f"{trigger_id} is not undecidable; only those are retried")
        await routing.put_back(conn, trigger_id)
    return {"trigger": trigger_id, "retried": True}
