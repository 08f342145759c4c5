"""What the deployment is doing, read from the database every replica shares.

Shown by ``superagent status`` and on the console.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from controlplane.db.pool import Db
from controlplane.domain import CLOSED_TICKET_SQL
from controlplane.gateway.devices import ONLINE_WINDOW
from controlplane.leadership import ROUTER_LEASE

WATCHDOG_MARK = "watchdog"  # the watchdog's row in leases (controlplane.watchdog.service)


QUARANTINE_SHOWN = 10  # items of each kind listed; the count says how many there are


@dataclass
class Quarantined:
    """Something set aside after failing, waiting for people."""

    kind: str  # trigger (undecidable), ticket (blocked), effect (dead)
    id: str
    reason: str
    since: datetime
    release: str  # the command that puts it back


@dataclass
class Status:
    model: str
    router_leader: str | None
    router_leader_since: datetime | None
    router_lease_expires_at: datetime | None
    router_lease_expired: bool
    router_inbox: int
    tickets_active: int
    workers_running: int  # rounds holding a slot now
    tickets_waiting_device: int
    tickets_waiting_human: int
    devices_online: int
    devices_paired: int
    paused_at: datetime | None
    paused_by: str | None
    paused_reason: str | None
    watchdog: str | None = None  # who runs it, when it last checked; None: not seen
    watchdog_last_pass: datetime | None = None
    watchdog_alive: bool = False
    quarantined_counts: dict[str, int] = field(default_factory=dict)
    quarantined: list[Quarantined] = field(default_factory=list)


_QUARANTINED = """
(SELECT 'trigger' AS kind, id, coalesce(route_error, '') AS reason, undecidable_at AS since,
        'superagent triggers retry ' || id AS release, count(*) OVER () AS total
 FROM triggers WHERE undecidable_at IS NOT NULL AND routed_at IS NOT NULL
 ORDER BY undecidable_at DESC LIMIT $1)
UNION ALL
(SELECT 'ticket', t.id, coalesce(t.last_error, r.summary, ''), t.updated_at,
        'superagent tickets retry ' || t.id, count(*) OVER ()
 FROM tickets t
 LEFT JOIN LATERAL (SELECT summary FROM reports WHERE ticket_id = t.id
                    ORDER BY created_at DESC LIMIT 1) r ON true
 WHERE t.state = 'waiting_human' AND t.hold = 'blocked'
 ORDER BY t.updated_at DESC LIMIT $1)
UNION ALL
(SELECT 'effect', id, kind || ': ' || coalesce(last_error, ''), dead_at,
        'superagent effects retry ' || id, count(*) OVER ()
 FROM effects WHERE dead_at IS NOT NULL ORDER BY dead_at DESC LIMIT $1)
"""


async def read(db: Db, model: str) -> Status:
    lease = await db.fetchrow(
        "SELECT holder, acquired_at, expires_at, expires_at < now() AS expired "
        "FROM leases WHERE name = $1",
        ROUTER_LEASE,
    )
    paused = await db.fetchrow("SELECT paused_at, paused_by, reason FROM pause")
    watchdog = await db.fetchrow(
        "SELECT holder, renewed_at, expires_at > now() AS alive FROM leases WHERE name = $1",
        WATCHDOG_MARK,
    )
    quarantined = await db.fetch(_QUARANTINED, QUARANTINE_SHOWN)
    counts = await db.fetchrow(
        "SELECT "
        "(SELECT count(*) FROM triggers WHERE routed_at IS NULL) AS inbox, "
        f"(SELECT count(*) FROM tickets WHERE state NOT IN ({CLOSED_TICKET_SQL})) "
        "  AS tickets, "
        "(SELECT count(*) FROM assignments WHERE ended_at IS NULL) AS rounds, "
        "(SELECT count(*) FROM tickets WHERE state = 'waiting_device') AS away, "
        "(SELECT count(*) FROM tickets WHERE state = 'waiting_human') AS asking, "
        "(SELECT count(*) FROM devices WHERE revoked_at IS NULL "
        "  AND connected_replica IS NOT NULL "
        "  AND last_seen_at > now() - CAST($1 AS interval)) "
        "  AS online, "
        "(SELECT count(*) FROM devices WHERE revoked_at IS NULL) AS paired",
        ONLINE_WINDOW,
    )
    assert counts is not None
    return Status(
        model=model,
        router_leader=lease["holder"] if lease else None,
        router_leader_since=lease["acquired_at"] if lease else None,
        router_lease_expires_at=lease["expires_at"] if lease else None,
        router_lease_expired=bool(lease["expired"]) if lease else False,
        router_inbox=counts["inbox"],
        tickets_active=counts["tickets"],
        workers_running=counts["rounds"],
        tickets_waiting_device=counts["away"],
        tickets_waiting_human=counts["asking"],
        devices_online=counts["online"],
        devices_paired=counts["paired"],
        paused_at=paused["paused_at"] if paused else None,
        paused_by=paused["paused_by"] if paused else None,
        paused_reason=paused["reason"] if paused else None,
        watchdog=watchdog["holder"] if watchdog else None,
        watchdog_last_pass=watchdog["renewed_at"] if watchdog else None,
        watchdog_alive=bool(watchdog["alive"]) if watchdog else False,
        quarantined_counts={row["kind"]: int(row["total"]) for row in quarantined},
        quarantined=[
            Quarantined(row["kind"], row["id"], row["reason"][:300], row["since"], row["release"])
            for row in quarantined
        ],
    )


def leader_line(status: Status) -> str:
    if status.router_leader is None:
        return "none: no replica is running (or none has started leading yet)"
    if status.router_lease_expired:
        return (
            f"none: {status.router_leader} stopped renewing its lease "
            f"{ago(status.router_lease_expires_at)}; another replica takes over at its "
            "next attempt"
        )
    assert status.router_lease_expires_at is not None
    left = (status.router_lease_expires_at - datetime.now(UTC)).total_seconds()
    return (
        f"{status.router_leader} (leading since {ago(status.router_leader_since)}, "
        f"lease renewed, {max(left, 0):.0f}s left)"
    )


def ago(when: datetime | None) -> str:
    if when is None:
        return "never"
    seconds = int((datetime.now(UTC) - when).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def watchdog_line(status: Status) -> str:
    if status.watchdog is None:
        return "never seen (`superagent up` runs it; with `serve`, run `superagent watchdog`)"
    when = ago(status.watchdog_last_pass)
    if not status.watchdog_alive:
        return f"NOT RUNNING: last pass {when} by {status.watchdog}"
    return f"{status.watchdog}, last pass {when}"
