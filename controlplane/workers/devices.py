"""Whether a ticket's device is there to run its commands."""

from __future__ import annotations

from datetime import timedelta

from controlplane.db.pool import Db
from controlplane.gateway.devices import ONLINE_WINDOW

# A device disconnected this long while its jobs run is away, not reconnecting.
AWAY_GRACE = timedelta(seconds=60)


async def device_online(db: Db, device_id: str) -> bool:
    """Connected to some replica and heard from lately (a replica killed with SIGKILL
    cannot clear its devices' ``connected_replica``, so silence counts too)."""
    online = await db.fetchval(
        "SELECT connected_replica IS NOT NULL AND last_seen_at > now() - $2::interval "
        "FROM devices WHERE id = $1 AND revoked_at IS NULL",
        device_id,
        ONLINE_WINDOW,
    )
    return bool(online)


async def device_gone(db: Db, device_id: str, grace: timedelta) -> bool:
    """Disconnected and unheard of for ``grace``: away, not between two reconnects."""
    gone = await db.fetchval(
        "SELECT connected_replica IS NULL AND coalesce(last_seen_at < now() - $2::interval, true) "
        "OR last_seen_at < now() - $3::interval OR revoked_at IS NOT NULL "
        "FROM devices WHERE id = $1",
        device_id,
        grace,
        ONLINE_WINDOW,
    )
    return bool(gone)
