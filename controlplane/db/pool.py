"""Raw asyncpg pools for the hot paths (the outbox, the device gateway).

Connections come back to the pool without asyncpg's default reset query (``UNLISTEN *;
RESET ALL; ...``, one extra round trip per release): our code never leaves session state
behind, and asyncpg still rolls back any open transaction and drops listeners first.
"""

from __future__ import annotations

import json

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
