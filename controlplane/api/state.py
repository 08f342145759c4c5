"""What HTTP handlers reach through ``request.app.state.superagent``."""

from __future__ import annotations

from dataclasses import dataclass, field

import asyncpg
from fastapi import Request
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.channels.base import Channels
from controlplane.ingest.intake import Intake
from controlplane.settings import Settings


@dataclass
class AppState:
    settings: Settings
    engine: AsyncEngine
    replica_id: str
    intake: Intake | None = None  # None: no channel can deliver events (tests of probes)
    pool: asyncpg.Pool | None = None
    channels: Channels = field(default_factory=Channels)


async def app_state(request: Request) -> AppState:
    # async: FastAPI runs a plain-function dependency in its thread pool, a thread hand-off
    # on every request for what is an attribute read.
    state = request.app.state.superagent
    assert isinstance(state, AppState)
    return state
