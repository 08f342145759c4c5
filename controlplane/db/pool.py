"""asyncpg pools: the one way runtime code reaches Postgres (SQLAlchemy models are only the
schema Alembic migrates; see ``db/migrate.py``).

Connections come back to the pool without asyncpg's default reset query (``UNLISTEN *;
RESET ALL; ...``, one extra round trip per release): our code never leaves session state
behind, and asyncpg still rolls back any open transaction and drops listeners first.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from controlplane.db import outage

# A connection as code receives it: its own, or one acquired from a pool.
Conn = asyncpg.Connection | PoolConnectionProxy
# Anything to run one statement on (a pool takes a connection for it).
Db = asyncpg.Pool | Conn

# The server enforces what our code promises: no transaction is ever left idle.
SERVER_SETTINGS = {"idle_in_transaction_session_timeout": "60000"}


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def _no_reset(conn: asyncpg.Connection) -> None:
    return None


async def connect(dsn: str) -> asyncpg.Connection:
    """One connection of its own, set up as the pools' connections are."""
    conn = await asyncpg.connect(dsn, server_settings=SERVER_SETTINGS)
    await _init_connection(conn)
    return conn


async def create_pool(
    dsn: str, *, size: int = 4, server_settings: dict[str, str] | None = None
) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(
        dsn,
        min_size=1,
        max_size=size,
        init=_init_connection,
        reset=_no_reset,
        server_settings={**SERVER_SETTINGS, **(server_settings or {})},
    )
    assert pool is not None
    outage.track(pool)
    return pool


@asynccontextmanager
async def transaction(db: Db) -> AsyncIterator[Conn]:
    """One transaction: committed on success, rolled back on any error.

    On a connection taken from ``db`` if it is a pool; on ``db`` itself if it is a
    connection (a savepoint there when it is in a transaction already).
    """
    if isinstance(db, asyncpg.Pool):
        async with db.acquire() as conn, conn.transaction():
            yield conn
    else:
        async with db.transaction():
            yield db
