"""Ways to the database that only tests use: the ORM, to seed rows from the models, and
helpers around the asyncpg functions the product runs on.

The control plane itself queries with asyncpg only (``controlplane/db/pool.py``); SQLAlchemy
there is the schema Alembic migrates. Tests may still write rows through the models (the
``engine`` and ``db`` fixtures of ``tests/conftest.py``).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from controlplane.db import pool as db_pool
from controlplane.db import urls
from controlplane.db.pool import SERVER_SETTINGS, Conn
from controlplane.db.urls import asyncpg_dsn, sqlalchemy_url
from controlplane.effects import outbox
from superagent_shared.ids import new_id

Sessions = async_sessionmaker[AsyncSession]


def with_database(url: str, database: str) -> str:
    """``url`` with another database name (on the same server)."""
    return urls.parse(url).set(database=database).render_as_string(hide_password=False)


def create_engine(url: str, *, pool_size: int = 10) -> AsyncEngine:
    return create_async_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        connect_args={"server_settings": dict(SERVER_SETTINGS)},
    )


def session_factory(engine: AsyncEngine) -> Sessions:
    return async_sessionmaker(engine, expire_on_commit=False)


@asynccontextmanager
async def transaction(sessions: Sessions) -> AsyncIterator[AsyncSession]:
    """One short ORM transaction: commit on success, roll back on any error."""
    async with sessions() as session, session.begin():
        yield session


@asynccontextmanager
async def asyncpg_transaction(db: Sessions | asyncpg.Pool | str) -> AsyncIterator[Conn]:
    """One asyncpg transaction on the database of ``db``: a pool (the ``pool`` fixture), or
    else on a connection of its own (closed afterwards) to the database of the ``db``
    fixture's sessions, or at a URL."""
    if isinstance(db, asyncpg.Pool):
        async with db_pool.transaction(db) as conn:
            yield conn
        return
    if isinstance(db, str):
        url = db
    else:
        bound = db.kw["bind"]
        assert isinstance(bound, AsyncEngine)
        url = bound.url.render_as_string(hide_password=False)
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        async with db_pool.transaction(conn) as inside:
            yield inside
    finally:
        await conn.close()


async def unreachable_pool() -> asyncpg.Pool:
    """A pool whose database never answers: it connects at first use, and fails then."""
    pool = await asyncpg.create_pool(
        "postgresql://nobody:pw-canary@127.0.0.1:1/none", min_size=0, max_size=1
    )
    assert pool is not None
    return pool


# outbox's statement for SQLAlchemy, whose text() binds by name.
_ENQUEUE_NAMED = text(re.sub(r"\$(\d)", r":p\1", outbox._ENQUEUE))


async def enqueue_in(
    session: AsyncSession,
    kind: str,
    key: str,
    payload: dict[str, Any],
    *,
    delay: float = 0.0,
) -> outbox.EffectRef:
    """``outbox.enqueue`` in an ORM session's transaction (for tests that seed with the ORM)."""
    result = await session.execute(
        _ENQUEUE_NAMED,
        {
            "p1": new_id("eff"),
            "p2": kind,
            "p3": key,
            "p4": json.dumps(payload),
            "p5": timedelta(seconds=delay),
        },
    )
    row = result.one()
    return outbox.EffectRef(row.id, row.generation)
