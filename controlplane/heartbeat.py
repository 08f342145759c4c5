"""Each replica says it is alive (``replicas.heartbeat_at``), so the watchdog can tell a
replica that stopped cleanly from one that went silent."""

from __future__ import annotations

import logging
import socket

import asyncpg

from controlplane import __version__
from controlplane.db import outage
from controlplane.services import Service, is_transient

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 10.0


class ReplicaHeartbeat(Service):
    name = "heartbeat"

    def __init__(self, pool: asyncpg.Pool, replica_id: str) -> None:
        super().__init__()
        self.pool = pool
        self.replica_id = replica_id

    async def run(self) -> None:
        while not self.stopping.is_set():
            try:
                await beat(self.pool, self.replica_id)
            except Exception as exc:
                if not is_transient(exc) and not isinstance(exc, asyncpg.PostgresError):
                    raise
                if not await outage.absorbed(exc, "heartbeat"):
                    log.warning("heartbeat: not recorded (%s)", exc)
            await outage.wait_back(self.stopping, HEARTBEAT_SECONDS)
        try:
            await self.pool.execute(
                "UPDATE replicas SET stopped_at = now() WHERE id = $1", self.replica_id
            )
        except outage.DATABASE_ERRORS as exc:
            log.warning("heartbeat: could not record the stop (%s)", exc)


async def beat(pool: asyncpg.Pool, replica_id: str) -> None:
    await pool.execute(
        "INSERT INTO replicas (id, hostname, version) VALUES ($1, $2, $3) "
        "ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), stopped_at = NULL",
        replica_id,
        socket.gethostname()[:200],
        __version__,
    )
