"""The Devices page: paired devices, pairing a new one, revoking one.

The same functions as ``superagent devices pair`` / ``list`` / ``show`` / ``revoke``; the
page adds what each device is doing (commands not finished, and the oldest one's age), and
lists the repositories each reports (what tickets for a repository are routed by).
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Any

import asyncpg

from controlplane.gateway import devices as registry
from controlplane.gateway import pairing, repositories
from controlplane.gateway.server import default_public_url
from controlplane.gateway.tls import gateway_tls
from controlplane.settings import Settings

CREATED_BY = "console"

FIRST_DEVICE_HINT = (
    "No device yet, so the agent has nowhere to run commands. To use the machine running "
    "the control plane, restart it with `superagent up --device ~/src` (it works inside "
    "~/src). For another machine, pair it here and run the command shown there. Then talk "
    'to the agent: `superagent say "/run NAME echo hello"`, or the web chat.'
)


async def listing(pool: asyncpg.Pool) -> dict[str, Any]:
    views = await registry.list_devices(pool, include_revoked=True)
    oldest = await pool.fetch(
        "SELECT device_id, min(created_at) AS oldest FROM commands "
        "WHERE state IN ('queued', 'delivered', 'running') GROUP BY device_id"
    )
    waiting = {row["device_id"]: row["oldest"] for row in oldest}
    clones = await repositories.of_devices(pool, [v.id for v in views if not v.revoked])
    live = any(not v.revoked for v in views)
    return {
        # What `superagent up` prints when no device is paired: the same next steps here.
        "hint": None if live else FIRST_DEVICE_HINT,
        "devices": [
            {
                **asdict(view),
                "oldest_queued": waiting.get(view.id),
                "repositories": [asdict(clone) for clone in clones.get(view.id, ())],
            }
            for view in sorted(views, key=lambda v: (v.revoked, v.name))
        ],
    }


def pair_command(settings: Settings, code: str) -> tuple[str, str, str | None]:
    """(the command to run on the device, the gateway URL, the CA fingerprint to pin)."""
    tls = gateway_tls(settings)
    url = default_public_url(settings.grpc)
    fingerprint = tls.fingerprint if tls else None
    command = f"endpointd pair {url} {code}"
    if fingerprint:
        command += f" --fingerprint {fingerprint}"
    return command, url, fingerprint


async def pair(
    settings: Settings,
    pool: asyncpg.Pool,
    *,
    name: str,
    owner: str | None,
    shared: str | None = None,
    by: str = CREATED_BY,
) -> dict[str, Any]:
    """A one-time pairing code for a new device (PairingRefused says why not). Owned by
    ``owner``, else by the admin (web:admin); ``shared``: a team device's group."""
    issued = await pairing.create_code(
        pool,
        device_name=name,
        owner=owner or None,
        created_by=by,
        shared_with=shared or None,
    )
    # Reads (or on first use writes) the TLS material, and may resolve this host's name.
    command, url, fingerprint = await asyncio.to_thread(pair_command, settings, issued.display)
    return {
        "code": issued.display,
        "device_name": issued.device_name,
        "owner": issued.owner,
        "shared_with": issued.shared_with,
        "expires_at": issued.expires_at,
        "url": url,
        "fingerprint": fingerprint,
        "command": command,
    }


async def revoke(pool: asyncpg.Pool, device: str) -> dict[str, Any]:
    revoked = await registry.revoke(pool, device)
    return {"id": revoked.id, "name": revoked.name, "revoked_at": revoked.revoked_at}
