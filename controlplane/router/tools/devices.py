"""Which device a request names: one by name or id, or "my laptop": one its requester owns
(owned by their person, ``superagent users link``, or by their account, never matched by
a display name or a handle). Of several that fit, the one with a clone of the request's
repository, when exactly one has it. A request naming no device is placed in code
(:mod:`controlplane.tickets.placement`)."""

from __future__ import annotations

import asyncpg

from controlplane.authorization import devices as access
from controlplane.db.pool import Conn
from controlplane.gateway import repositories
from controlplane.tools.registry import Refused


async def named(
    conn: Conn, device: str | None, requested: asyncpg.Record, *, repo: str | None = None
) -> str | None:
    """A device by name or id; "my laptop" (any "my …") is one the initiator owns."""
    if device is None:
        return None
    found = await conn.fetchval(
        "SELECT id FROM devices WHERE (id = $1 OR name = $1) AND revoked_at IS NULL",
        device,
    )
    if found is not None:
        return str(found)
    words = device.strip().casefold().split()
    if words[0] not in ("my", "mine"):
        raise Refused(f"no paired device {device!r}")
    requester = await access.requester_of_trigger(conn, requested["id"])
    owned = await access.owned(conn, requester)
    who = requester.name
    if not owned:
        raise Refused(
            f"{who} owns no paired device (pair one with `superagent devices pair --name "
            f"NAME --owner {requester.handle}`, or link their accounts to the person who "
            "owns one with `superagent users link`)"
        )
    kind = words[1:]  # "my laptop" → prefer a device called or labelled laptop
    fitting = [d for d in owned if not kind or any(k in d[1] for k in kind)]
    if len(fitting) == 1:
        return fitting[0][0]
    if len(owned) == 1:
        return owned[0][0]
    if repo is not None:
        clones = await repositories.clones_of(conn, repo)
        having = [d for d in (fitting or owned) if d[0] in clones]
        if len(having) == 1:
            return having[0][0]
    names = ", ".join(name for _, name in owned)
    raise Refused(f"{who} owns several devices ({names}); name one of them")
