"""What a channel adapter is built from."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from controlplane.ingest.intake import Intake
from controlplane.settings import Settings


@dataclass(frozen=True)
class ChannelContext:
    settings: Settings
    pool: asyncpg.Pool
    intake: Intake
    dsn: str  # for loops that LISTEN on a dedicated connection
    replica_id: str
