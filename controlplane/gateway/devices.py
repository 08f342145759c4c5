"""Paired devices as admins see them: list with liveness, queue depth and sandbox, revoke."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, or_, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.db.models import Command, Device, DeviceShare
from controlplane.domain import LIVE_COMMAND_STATES, Notify
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


async def list_devices(session: AsyncSession, *, include_revoked: bool = False) -> list[DeviceView]:
    depth = (
        select(Command.device_id, func.count().label("depth"))
        .where(Command.state.in_(LIVE_COMMAND_STATES))
        .group_by(Command.device_id)
        .subquery()
    )
    query = (
        select(Device, func.coalesce(depth.c.depth, 0))
        .outerjoin(depth, depth.c.device_id == Device.id)
        .order_by(Device.name)
    )
    if not include_revoked:
        query = query.where(Device.revoked_at.is_(None))
    now = datetime.now(UTC)
    shares: dict[str, list[str]] = {}
    for share in await session.scalars(select(DeviceShare).order_by(DeviceShare.grantee)):
        shares.setdefault(share.device_id, []).append(share.grantee)
    views = []
    for device, queue_depth in (await session.execute(query)).all():
        online = (
            device.revoked_at is None
            and device.connected_replica is not None
            and device.last_seen_at is not None
            and now - device.last_seen_at < ONLINE_WINDOW
        )
        views.append(
            DeviceView(
                id=device.id,
                name=device.name,
                owner=device.owner,
                online=online,
                last_seen_at=device.last_seen_at,
                queue_depth=int(queue_depth),
                policy_hash=device.policy_hash,
                sandbox=device.sandbox,
                sandbox_warning=sandbox_warning(device.sandbox),
                version=device.version,
                revoked=device.revoked_at is not None,
                shares=tuple(shares.get(device.id, ())),
            )
        )
    return views


async def find(session: AsyncSession, name_or_id: str) -> Device:
    device = await session.scalar(
        select(Device)
        .where(or_(Device.id == name_or_id, Device.name == name_or_id))
        .order_by(Device.revoked_at.is_(None).desc(), Device.created_at.desc())
        .limit(1)
    )
    if device is None:
        raise NotFound(f"no device named or with id {name_or_id!r}")
    return device


async def revoke(session: AsyncSession, name_or_id: str) -> Device:
    """Revoke a device: its open stream closes within a second and it cannot reconnect."""
    device = await find(session, name_or_id)
    if device.revoked_at is None:
        device.revoked_at = datetime.now(UTC)
        device.connected_replica = None
        await session.execute(
            text(f"SELECT pg_notify('{Notify.DEVICES}', :payload)"),
            {"payload": f"revoked:{device.id}"},
        )
    return device
