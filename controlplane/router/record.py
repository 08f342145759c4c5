"""What the router did about one trigger, read back from ``router_decisions`` (written only
by :func:`controlplane.router.tools.toolbox.record`): each call a turn over it made,
accepted or refused, oldest first. A refused call, or one that names no trigger (a recall,
a subscribe), is on record under its turn's whole batch, so a request shows every call
made while it was being decided. Read by ``superagent triggers show`` and the console's
trigger feed."""

from __future__ import annotations

from typing import Any

from controlplane.db.pool import Db

SHOWN = 50  # calls listed per trigger, the latest
OUTCOME_CHARS = 300

# One trigger's calls as a JSON array (jsonb, which the pool decodes), in a query over
# triggers aliased ``g`` (the feed).
CALLS_JSON = f"""(
    SELECT coalesce(jsonb_agg(jsonb_build_object(
        'tool', d.tool, 'ok', d.ok, 'outcome', left(d.outcome, {OUTCOME_CHARS}),
        'at', d.created_at) ORDER BY d.created_at, d.id), '[]'::jsonb)
    FROM (SELECT * FROM router_decisions WHERE trigger_ids @> ARRAY[g.id]::varchar[]
          ORDER BY created_at DESC, id DESC LIMIT {SHOWN}) d
)"""


async def calls(db: Db, trigger_id: str) -> list[dict[str, Any]]:
    """The router's calls over ``trigger_id`` (the latest :data:`SHOWN`), oldest first:
    tool, arguments as the model sent them, ok, outcome, when."""
    rows = await db.fetch(
        "SELECT * FROM (SELECT tool, arguments, ok, outcome, created_at, id "
        "FROM router_decisions WHERE trigger_ids @> ARRAY[$1]::varchar[] "
        "ORDER BY created_at DESC, id DESC LIMIT $2) d ORDER BY created_at, id",
        trigger_id,
        SHOWN,
    )
    return [dict(row) for row in rows]


def decision(calls: list[dict[str, Any]]) -> str:
    """What was decided, in a line: the accepted calls' outcomes that decide something,
    else that nothing was accepted."""
    accepted = [f"{c['tool']}: {c['outcome']}" for c in calls if c["ok"]]
    if accepted:
        return "; ".join(accepted)
    if calls:
        return f"nothing accepted ({len(calls)} call(s) refused)"
    return "no call yet"
