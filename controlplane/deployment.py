"""The deployment: what its replicas, router leader, watchdog, devices and queues are doing,
read from the database every replica shares.

Shown by ``superagent status`` and on the console's overview. The module is named for what
it reads, not for the command: in the control plane's code "status" is a worker report's
(``reports.status``), and endpointd's status is the device's own. Everything here is the
deployment's view: the model is the one the running replicas recorded with their heartbeats
(``controlplane.heartbeat``), never the one the reading process's settings name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import TypeAdapter

from controlplane.db.pool import Db
from controlplane.domain import CLOSED_TICKET_SQL
from controlplane.gateway.devices import ONLINE_WINDOW
from controlplane.heartbeat import ALIVE_WINDOW
from controlplane.leadership import ROUTER_LEASE

WATCHDOG_MARK = "watchdog"  # the watchdog's row in leases (controlplane.watchdog.service)


QUARANTINE_SHOWN = 10  # items of each kind listed; the count says how many there are
FINDINGS_SHOWN = 5  # open findings listed, newest first; the count says how many are open
DEVICES_SHOWN = 10  # devices listed, online first; the count says how many are paired
RULES_ONLY = "none (rules-only mode)"
NO_REPLICA = "no replica is running: start one with `superagent up` or check your deployment"


@dataclass
class Replica:
    """A control-plane replica as its heartbeat row says."""

    id: str
    hostname: str
    pid: int | None
    version: str
    model: str  # its models and endpoint host in one phrase, or RULES_ONLY
    started_at: datetime
    heartbeat_at: datetime
    stopped_at: datetime | None
    leader: bool  # holds the router lease now
    runs_with: dict[str, Any]  # as recorded ({}: by a release older than the record)


@dataclass
class OpenFinding:
    kind: str
    subject: str
    severity: str
    summary: str
    first_seen_at: datetime
    times_seen: int


@dataclass
class DeviceLine:
    name: str
    online: bool
    last_seen_at: datetime | None


@dataclass
class Shell:
    """What the process reading the deployment is configured with: not the deployment's."""

    model: str
    database: str  # host:port/name of the database read, or the embedded one's directory


@dataclass
class Quarantined:
    """Something set aside after failing, waiting for people."""

    kind: str  # trigger (undecidable), ticket (blocked), effect (dead)
    id: str
    reason: str
    since: datetime
    release: str  # the command that puts it back


@dataclass
class Deployment:
    """What the deployment is doing, as read at one moment (:func:`read`)."""

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
    model_from: str | None = None  # the replica whose record names the model
    replicas: list[Replica] = field(default_factory=list)  # running ones, oldest first
    last_replica: Replica | None = None  # with none running: the last one heard of
    version_skew: list[str] = field(default_factory=list)  # releases, when more than one
    model_skew: list[str] = field(default_factory=list)  # models, when replicas differ
    findings_open: int = 0
    findings: list[OpenFinding] = field(default_factory=list)
    devices: list[DeviceLine] = field(default_factory=list)
    shell: Shell | None = None  # set by the CLI: the calling shell's own settings


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


_REPLICAS = """
SELECT r.id, r.hostname, r.version, r.started_at, r.heartbeat_at, r.stopped_at,
       r.runs_with, coalesce(l.holder = r.id AND l.expires_at > now(), false) AS leader,
       r.stopped_at IS NULL AND r.heartbeat_at > now() - CAST($1 AS interval) AS alive
FROM replicas r LEFT JOIN leases l ON l.name = $2
WHERE (r.stopped_at IS NULL AND r.heartbeat_at > now() - CAST($1 AS interval))
   OR r.id = (SELECT id FROM replicas
              ORDER BY greatest(heartbeat_at, stopped_at) DESC LIMIT 1)
ORDER BY r.started_at, r.id
"""

_FINDINGS = """
SELECT kind, subject, severity, summary, first_seen_at, times_seen,
       count(*) OVER () AS total
FROM watchdog_findings WHERE resolved_at IS NULL
ORDER BY first_seen_at DESC, id LIMIT $1
"""

_DEVICES = """
SELECT name, last_seen_at,
       connected_replica IS NOT NULL AND last_seen_at > now() - CAST($1 AS interval) AS online
FROM devices WHERE revoked_at IS NULL
ORDER BY 3 DESC, last_seen_at DESC NULLS LAST, name LIMIT $2
"""


def model_phrase(runs_with: dict[str, Any]) -> str:
    """One replica's models and endpoint host, from its record."""
    router = runs_with.get("router_model")
    if not router:
        return RULES_ONLY
    worker = runs_with.get("worker_model")
    models = f"{router} (router), {worker} (workers)" if worker and worker != router else router
    host = runs_with.get("model_host")
    return f"{models} at {host}" if host else models


def _replica(row: Any) -> Replica:
    runs_with = dict(row["runs_with"] or {})
    pid = runs_with.get("pid")
    return Replica(
        id=row["id"],
        hostname=row["hostname"],
        pid=pid if isinstance(pid, int) else None,
        version=row["version"],
        model=model_phrase(runs_with) if runs_with else "unknown (recorded by an older release)",
        started_at=row["started_at"],
        heartbeat_at=row["heartbeat_at"],
        stopped_at=row["stopped_at"],
        leader=bool(row["leader"]),
        runs_with=runs_with,
    )


def _deployment_model(
    alive: list[Replica], last: Replica | None, fallback: str | None
) -> tuple[str, str | None]:
    """The model the deployment runs with, and the replica whose record says so: the
    leader's (it routes), else the running replica heard from last."""
    recorded = [r for r in alive if r.runs_with]
    if recorded:
        chosen = next((r for r in recorded if r.leader), None) or max(
            recorded, key=lambda r: r.heartbeat_at
        )
        return chosen.model, chosen.id
    if alive:
        return "unknown: the running replicas are of a release that does not record it", None
    if fallback is not None:
        return fallback, None
    if last is not None and last.runs_with:
        return f"unknown (no replica is running; the last, {last.id}, ran {last.model})", None
    return "unknown (no replica is running)", None


async def read(db: Db, fallback_model: str | None = None) -> Deployment:
    """What the deployment is doing now. ``fallback_model``: the reading replica's own model, shown
    only while no running replica has recorded one (the console, inside a replica, just
    after it started); the CLI passes none, as its shell is not the deployment."""
    rows = await db.fetch(_REPLICAS, ALIVE_WINDOW, ROUTER_LEASE)
    alive = [_replica(row) for row in rows if row["alive"]]
    gone = [_replica(row) for row in rows if not row["alive"]]
    model, model_from = _deployment_model(alive, gone[0] if gone else None, fallback_model)
    versions = sorted({r.version for r in alive})
    models = sorted({r.model for r in alive if r.runs_with})
    open_findings = await db.fetch(_FINDINGS, FINDINGS_SHOWN)
    devices = await db.fetch(_DEVICES, ONLINE_WINDOW, DEVICES_SHOWN)
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
    return Deployment(
        model=model,
        model_from=model_from,
        replicas=alive,
        last_replica=gone[0] if gone and not alive else None,
        version_skew=versions if len(versions) > 1 else [],
        model_skew=models if len(models) > 1 else [],
        findings_open=int(open_findings[0]["total"]) if open_findings else 0,
        findings=[
            OpenFinding(
                row["kind"],
                row["subject"],
                row["severity"],
                row["summary"][:300],
                row["first_seen_at"],
                row["times_seen"],
            )
            for row in open_findings
        ],
        devices=[
            DeviceLine(row["name"], bool(row["online"]), row["last_seen_at"]) for row in devices
        ],
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


def leader_line(now: Deployment) -> str:
    if now.router_leader is None:
        if now.replicas:
            return "none yet: the running replicas have not elected one"
        return "none: no replica is running (or none has started leading yet)"
    if now.router_lease_expired:
        return (
            f"none: {now.router_leader} stopped renewing its lease "
            f"{ago(now.router_lease_expires_at)}; another replica takes over at its "
            "next attempt"
        )
    assert now.router_lease_expires_at is not None
    left = (now.router_lease_expires_at - datetime.now(UTC)).total_seconds()
    return (
        f"{now.router_leader} (leading since {ago(now.router_leader_since)}, "
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


def watchdog_line(now: Deployment) -> str:
    if now.watchdog is None:
        return "never seen (`superagent up` runs it; with `serve`, run `superagent watchdog`)"
    when = ago(now.watchdog_last_pass)
    if not now.watchdog_alive:
        return f"NOT RUNNING: last pass {when} by {now.watchdog}"
    return f"{now.watchdog}, last pass {when}"


_AS_JSON: TypeAdapter[Deployment] = TypeAdapter(Deployment)


def as_json(found: Deployment) -> dict[str, Any]:
    """The deployment as JSON (the HTTP API's ``/console/api/status``)."""
    data: dict[str, Any] = _AS_JSON.dump_python(found, mode="json")
    return data


def from_json(data: dict[str, Any]) -> Deployment:
    """What :func:`as_json` made: ``superagent status`` over a context."""
    return _AS_JSON.validate_python(data)
