"""For commands that read or change the database once and exit (devices, status, policy)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.cli.common import clear_errors
from controlplane.db import migrate
from controlplane.db.database import open_database
from controlplane.db.engine import create_engine, session_factory, transaction
from controlplane.db.pool import create_pool
from controlplane.db.urls import asyncpg_dsn
from controlplane.settings import Settings

T = TypeVar("T")


def run_in_session(settings: Settings, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
    """``work`` in one transaction on the configured (or embedded) database."""

    async def main(url: str) -> T:
        engine = create_engine(url, pool_size=1)
        try:
            await migrate.check_migrated(engine)
            async with transaction(session_factory(engine)) as session:
                return await work(session)
        finally:
            await engine.dispose()

    with clear_errors(), open_database(settings) as database:
        return asyncio.run(main(database.url))


def run_with_pool(settings: Settings, work: Callable[[asyncpg.Pool], Awaitable[T]]) -> T:
    """``work`` with a small raw pool (for the hot-path modules built on asyncpg)."""

    async def main(url: str) -> T:
        engine = create_engine(url, pool_size=1)
        try:
            await migrate.check_migrated(engine)
        finally:
            await engine.dispose()
        pool = await create_pool(asyncpg_dsn(url), size=2)
        try:
            return await work(pool)
        finally:
            await pool.close()

    with clear_errors(), open_database(settings) as database:
        return asyncio.run(main(database.url))
