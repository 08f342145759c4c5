"""Paired devices: the registry (``devices``, written only here) and the devices as
admins see them: list with liveness, queue depth, sandbox and the repositories they report;
revoke.

What the gateway learns of a device is recorded through this module's writers: a device
paired (:mod:`.pairing`), connected and heard from (:mod:`.stream`, :mod:`.hub`), what it
reported (:mod:`.repositories`). The queue's ``next_seq`` is the exception: it is taken in
the statement that queues a command (:mod:`.queue`), so two commands never share one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from controlplane.db.pool import Db, transaction
from controlplane.domain import LIVE_COMMAND_STATES, Notify, from_iso
from controlplane.errors import NotFound

# A stream sends heartbeats every 15 s and replicas batch last_seen writes every 5 s; a
# device not heard of for 45 s is offline even if a killed replica could not say so.
ONLINE_WINDOW = timedelta(seconds=45)


@dataclass(frozen=True)
class DeviceView:
    id: str
    name: str
    owner: str | None
    online: bool
    last_seen_at: datetime | None
    queue_depth: int
    policy_hash: str | None
    # How the device confines commands, as its last Hello said (None: not reported, by a
    # daemon too old to, or never connected); sandbox_warning: what is wrong with it, in
    # plain words, when commands run unconfined or not fully confined (else None).
    sandbox: str | None
    sandbox_warning: str | None
    version: str | None
    revoked: bool
    # Whom the owner shares it with: people, accounts (SOURCE:ID), groups (group:SOURCE:ID).
    shares: tuple[str, ...] = ()
    # When it last reported its repositories (None: never, e.g. a daemon older than the
    # report), and whether its scan stopped at its bounds (there may be more).
    repositories_reported_at: datetime | None = None
    repositories_truncated: bool | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DeviceView:
        """The view as the console's JSON carries it (a deployment's answer over HTTP)."""
        return cls(
            id=data["id"],
            name=data["name"],
            owner=data["owner"],
            online=data["online"],
            last_seen_at=from_iso(data["last_seen_at"]),
            queue_depth=data["queue_depth"],
            policy_hash=data["policy_hash"],
            sandbox=data["sandbox"],
            sandbox_warning=data["sandbox_warning"],
            version=data["version"],
            revoked=data["revoked"],
            shares=tuple(data["shares"]),
            repositories_reported_at=from_iso(data["repositories_reported_at"]),
            repositories_truncated=data["repositories_truncated"],
        )


# What is shown for a device that connected without saying how it confines commands.
SANDBOX_UNKNOWN = "unknown (daemon too old)"


def sandbox_warning(sandbox: str | None) -> str | None:
    """What an admin should know about a device's sandbox line, or None when it confines
    commands fully (or is unknown).

    The line is endpointd's ``Policy.sandbox_summary``: ``MODE; MECHANISM; network N``,
    ``MODE, cannot enforce: WHAT; MECHANISM; network N`` (MECHANISM ``none`` when the OS
    has no sandbox endpointd can use), ``off (chosen in the policy); network N``, or
    ``none: …`` when the policy file cannot be used.
    """
    if not sandbox:
        return None
    if sandbox.startswith("off"):
        return "commands run unconfined"  # the owner turned the sandbox off
    if sandbox.startswith("none"):
        return "policy unusable: commands refused"
    if "cannot enforce" not in sandbox:
        return None
    if sandbox.startswith("required"):
        return "sandbox incomplete: commands refused"
    if "; none; network " in sandbox:
        return "commands run unconfined"  # best-effort, and no OS sandbox at all
    return "sandbox incomplete"


def sandbox_shown(view: DeviceView) -> str:
    """The sandbox line as shown: "unknown (daemon too old)" for a device that connected
    without one, "-" for one that never connected."""
    if view.sandbox:
        return view.sandbox
    return SANDBOX_UNKNOWN if view.last_seen_at is not None else "-"


@dataclass(frozen=True)
class Revoked:
    id: str
    name: str
    revoked_at: datetime


_LIST = """
SELECT d.id, d.name, d.owner, d.last_seen_at, d.policy_hash, d.sandbox, d.version,
       d.revoked_at, d.connected_replica, d.repositories_reported_at,
       d.repositories_truncated, coalesce(q.depth, 0) AS depth
FROM devices d LEFT JOIN (
    SELECT device_id, count(*) AS depth FROM commands WHERE state = ANY($1::text[])
    GROUP BY device_id
) q ON q.device_id = d.id
"""


async def list_devices(db: Db, *, include_revoked: bool = False) -> list[DeviceView]:
    query = _LIST + ("" if include_revoked else "WHERE d.revoked_at IS NULL ") + "ORDER BY d.name"
    shares: dict[str, list[str]] = {}
    for share in await db.fetch("SELECT device_id, grantee FROM device_shares ORDER BY grantee"):
        shares.setdefault(share["device_id"], []).append(share["grantee"])
    rows = await db.fetch(query, list(LIVE_COMMAND_STATES))
    return [_view(row, tuple(shares.get(row["id"], ()))) for row in rows]


async def find(db: Db, name_or_id: str) -> DeviceView:
    """One device by name or id (an active one before a revoked one of the same name)."""
    row = await db.fetchrow(
        _LIST + "WHERE d.id = $2 OR d.name = $2 "
        "ORDER BY (d.revoked_at IS NULL) DESC, d.created_at DESC LIMIT 1",
        list(LIVE_COMMAND_STATES),
        name_or_id,
    )
    if row is None:
        raise NotFound(f"no device named or with id {name_or_id!r}")
    shares = await db.fetch(
        "SELECT grantee FROM device_shares WHERE device_id = $1 ORDER BY grantee", row["id"]
    )
    return _view(row, tuple(share["grantee"] for share in shares))


def _view(device: asyncpg.Record, shares: tuple[str, ...]) -> DeviceView:
    last_seen_at = device["last_seen_at"]
    online = (
        device["revoked_at"] is None
        and device["connected_replica"] is not None
        and last_seen_at is not None
        and datetime.now(UTC) - last_seen_at < ONLINE_WINDOW
    )
    return DeviceView(
        id=device["id"],
        name=device["name"],
        owner=device["owner"],
        online=online,
        last_seen_at=last_seen_at,
        queue_depth=int(device["depth"]),
        policy_hash=device["policy_hash"],
        sandbox=device["sandbox"],
        sandbox_warning=sandbox_warning(device["sandbox"]),
        version=device["version"],
        revoked=device["revoked_at"] is not None,
        shares=shares,
        repositories_reported_at=device["repositories_reported_at"],
        repositories_truncated=device["repositories_truncated"],
    )


async def online(db: Db, device_ids: Sequence[str]) -> set[str]:
    """Which of ``device_ids`` are online now, judged as :func:`list_devices` judges it."""
    rows = await db.fetch(
        "SELECT id FROM devices WHERE id = ANY($1::text[]) AND revoked_at IS NULL "
        "AND connected_replica IS NOT NULL AND last_seen_at > now() - $2::interval",
        list(device_ids),
        ONLINE_WINDOW,
    )
    return {row["id"] for row in rows}


async def revoke(db: Db, name_or_id: str) -> Revoked:
    """Revoke a device: its open stream closes within a second and it cannot reconnect."""
    async with transaction(db) as conn:
        device = await conn.fetchrow(
            "SELECT id, name, revoked_at FROM devices WHERE id = $1 OR name = $1 "
            "ORDER BY (revoked_at IS NULL) DESC, created_at DESC LIMIT 1",
            name_or_id,
        )
        if device is None:
            raise NotFound(f"no device named or with id {name_or_id!r}")
        revoked_at = device["revoked_at"]
        if revoked_at is None:
            revoked_at = datetime.now(UTC)
            await conn.execute(
                "UPDATE devices SET revoked_at = $2, connected_replica = NULL WHERE id = $1",
                device["id"],
                revoked_at,
            )
            await conn.execute(
                f"SELECT pg_notify('{Notify.DEVICES}', $1)", f"revoked:{device['id']}"
            )
    return Revoked(device["id"], device["name"], revoked_at)


# -- the registry's writers ----------------------------------------------------------------


async def add(
    conn: Db, device_id: str, name: str, owner: str, public_key: bytes, version: str, labels: str
) -> None:
    """A newly paired device (``labels``: JSON text); its commands are numbered from 1."""
    await conn.execute(
        "INSERT INTO devices (id, name, owner, public_key, version, labels, next_seq) "
        "VALUES ($1, $2, $3, $4, $5, CAST($6 AS text)::jsonb, 1)",
        device_id,
        name,
        owner,
        public_key,
        version,
        labels,
    )


async def connected(
    db: Db, device_id: str, version: str, policy_hash: str, replica: str, sandbox: str | None
) -> int | None:
    """The device connected to ``replica`` and said who it is (its Hello). Returns when, in
    microseconds of the database's clock (which every replica shares, so connections of one
    device are ordered across replicas by it), or None when the device is gone."""
    connected_at: int | None = await db.fetchval(
        "UPDATE devices SET version = $2, policy_hash = $3, last_seen_at = now(), "
        "connected_replica = $4, connected_at = now(), sandbox = $5 WHERE id = $1 "
        "RETURNING (extract(epoch FROM connected_at) * 1000000)::bigint",
        device_id,
        version,
        policy_hash,
        replica,
        sandbox,
    )
    return connected_at


async def disconnected(db: Db, device_id: str, replica: str) -> None:
    """The device's stream on ``replica`` ended (unless it is held elsewhere by now)."""
    await db.execute(
        "UPDATE devices SET connected_replica = NULL, last_seen_at = now() "
        "WHERE id = $1 AND connected_replica = $2",
        device_id,
        replica,
    )


async def seen(db: Db, device_ids: list[str], replica: str) -> None:
    """The devices were heard from on ``replica`` (a batch of heartbeats)."""
    await db.execute(
        "UPDATE devices SET last_seen_at = now(), connected_replica = $2 "
        "WHERE id = ANY($1::text[])",
        device_ids,
        replica,
    )


async def gone(db: Db, device_ids: list[str], replica: str) -> None:
    """The devices are no longer held on ``replica``."""
    await db.execute(
        "UPDATE devices SET connected_replica = NULL "
        "WHERE id = ANY($1::text[]) AND connected_replica = $2",
        device_ids,
        replica,
    )


async def reported(
    conn: Db,
    device_id: str,
    truncated: bool,
    harnesses: list[dict[str, object]],
    default_harness: str,
) -> None:
    """When the device last reported its repositories, and the harnesses it has."""
    await conn.execute(
        "UPDATE devices SET repositories_reported_at = now(), repositories_truncated = $2, "
        "harnesses = $3, default_harness = $4 WHERE id = $1",
        device_id,
        truncated,
        harnesses,
        default_harness,
    )
