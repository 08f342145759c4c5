"""For commands that read or change the database once and exit (devices, status, policy)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from controlplane.cli import contexts, remote
from controlplane.cli.common import clear_errors
from controlplane.db import migrate
from controlplane.db.database import open_database
from controlplane.db.pool import create_pool
from controlplane.db.urls import asyncpg_dsn
from controlplane.settings import Settings

T = TypeVar("T")


def run_with_pool(settings: Settings, work: Callable[[asyncpg.Pool], Awaitable[T]]) -> T:
    """``work`` with a small pool on the configured (or embedded) database, once its schema
    is this release's. A change that must be one transaction takes it from the pool
    (``controlplane.db.pool.transaction``). With a context chosen, the command meant a
    deployment's HTTP API, which it does not use yet: one clear line, not the wrong place."""

    async def main(url: str) -> T:
        pool = await create_pool(asyncpg_dsn(url), size=2)
        try:
            await migrate.check_migrated(pool)
            return await work(pool)
        finally:
            await pool.close()

    with clear_errors():
        if contexts.chosen() is not None:
            raise remote.not_over_http()
    with clear_errors(), open_database(settings) as database:
        return asyncio.run(main(database.url))
