"""What HTTP handlers reach through ``request.app.state.superagent``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import asyncpg
from fastapi import Request

from controlplane.ingest.intake import Intake
from controlplane.settings import Settings


class Adapters(Protocol):
    """The configured channel adapters (``channels.base.Channels``), as routes see them.

    A protocol rather than the class, so this module sits below the channels: a route
    looks up its own adapter and checks its type.
    """

    def get(self, source: str, /) -> object | None: ...

    def sources(self) -> list[str]: ...


class NoAdapters:
    """No channel configured (tests of probes, the API alone)."""

    def get(self, source: str, /) -> object | None:
        return None

    def sources(self) -> list[str]:
        return []


@dataclass
class AppState:
    settings: Settings
    pool: asyncpg.Pool  # the replica's pool: every route's way to the database
    replica_id: str
    intake: Intake | None = None  # None: no channel can deliver events (tests of probes)
    channels: Adapters = field(default_factory=NoAdapters)


async def app_state(request: Request) -> AppState:
    # async: FastAPI runs a plain-function dependency in its thread pool, a thread hand-off
    # on every request for what is an attribute read.
    state = request.app.state.superagent
    assert isinstance(state, AppState)
    return state
