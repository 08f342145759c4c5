"""Each replica says it is alive (``replicas.heartbeat_at``), so the watchdog can tell a
replica that stopped cleanly from one that went silent, and what it runs with
(``replicas.runs_with``), so ``superagent status`` describes the deployment rather than the
shell it is typed in.

This module is the table's only writer. What a replica records is an allow-list of fields
(:class:`Record`), each picked out of the settings by name: never a dump of the settings,
which hold the model key, channel tokens and the admin token.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import asyncpg

from controlplane import __version__
from controlplane.db import outage
from controlplane.db.pool import Db
from controlplane.services import Service, is_transient
from controlplane.settings import Settings

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 10.0
# A replica counts as running while its last beat is younger than three of its intervals:
# one late beat (a slow statement, a database blip) does not make it disappear.
ALIVE_WINDOW = timedelta(seconds=3 * HEARTBEAT_SECONDS)

DEFAULT_MODEL_HOST = "api.openai.com"  # where the openai client goes with no base URL
_TEXT_CAP = 200


@dataclass(frozen=True)
class Record:
    """What one replica runs with, secrets excluded. ``router_model`` None: rules-only."""

    version: str
    router_model: str | None
    worker_model: str | None
    model_host: str | None  # host[:port] of the model endpoint, nothing else of its URL
    channels: tuple[str, ...]
    hostname: str
    pid: int

    @classmethod
    def of(cls, settings: Settings, channels: list[str]) -> Record:
        """This process's record: ``channels`` are the enabled channels' source names."""
        modelled = settings.model_configured
        return cls(
            version=__version__,
            router_model=settings.llm.router_model[:_TEXT_CAP] if modelled else None,
            worker_model=settings.llm.worker_model[:_TEXT_CAP] if modelled else None,
            model_host=endpoint_host(settings.openai_base_url) if modelled else None,
            channels=tuple(sorted(channels)),
            hostname=socket.gethostname()[:_TEXT_CAP],
            pid=os.getpid(),
        )

    def runs_with(self) -> dict[str, Any]:
        """The ``runs_with`` column (version and hostname have columns of their own)."""
        return {
            "pid": self.pid,
            "router_model": self.router_model,
            "worker_model": self.worker_model,
            "model_host": self.model_host,
            "channels": list(self.channels),
        }


def endpoint_host(base_url: str | None) -> str:
    """The model endpoint's host and port only: a base URL may carry a key in its user-info
    (``https://user:key@host``) or its query (``?api-key=...``), and its path may too."""
    if base_url is None:
        return DEFAULT_MODEL_HOST
    try:
        parts = urlsplit(base_url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return "unparsable URL"
    if not host:
        return "unparsable URL"
    shown = f"[{host}]" if ":" in host else host
    return f"{shown}:{port}"[:_TEXT_CAP] if port else shown[:_TEXT_CAP]


class ReplicaHeartbeat(Service):
    name = "heartbeat"

    def __init__(self, pool: asyncpg.Pool, replica_id: str, record: Record) -> None:
        super().__init__()
        self.pool = pool
        self.replica_id = replica_id
        self.record = record

    async def run(self) -> None:
        while not self.stopping.is_set():
            try:
                await beat(self.pool, self.replica_id, self.record)
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


async def beat(db: Db, replica_id: str, record: Record) -> None:
    await db.execute(
        "INSERT INTO replicas (id, hostname, version, runs_with) VALUES ($1, $2, $3, $4) "
        "ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), stopped_at = NULL, "
        "runs_with = EXCLUDED.runs_with",
        replica_id,
        record.hostname,
        record.version,
        record.runs_with(),
    )
