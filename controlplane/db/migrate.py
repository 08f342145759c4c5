"""Schema migrations: upgrade, inspect, and the start-up check that refuses old schemas.

The one place where SQLAlchemy runs: Alembic upgrades through an engine, made here for the
upgrade and disposed of after it (its errors reach callers as asyncpg's own, as everywhere
else). Which revision a database is at is one row of ``alembic_version``, read with asyncpg
like any other query.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import sqlalchemy.exc
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from controlplane.db.pool import SERVER_SETTINGS, Db
from controlplane.db.urls import sqlalchemy_url
from controlplane.errors import DatabaseNotMigrated

MIGRATIONS = Path(__file__).parent / "migrations"
# Replicas of a rolling deploy may all try to migrate at once; one transaction-scoped
# advisory lock serializes them (and, unlike session locks, works behind PgBouncer).
_LOCK_KEY = 0x5A_A6E7


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def _current(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


@contextlib.contextmanager
def _driver_errors() -> Iterator[None]:
    """SQLAlchemy's wrapper taken off a database error: callers see what asyncpg raised
    (a refused connection is an ``OSError`` either way), as from every other query."""
    try:
        yield
    except sqlalchemy.exc.DBAPIError as exc:
        cause = exc.orig.__cause__ if exc.orig is not None else None
        if isinstance(cause, Exception):
            raise cause from None
        raise


@contextlib.asynccontextmanager
async def engine(url: str) -> AsyncIterator[AsyncEngine]:
    """An engine for Alembic on ``url`` (one connection at a time), disposed of afterwards."""
    made = create_async_engine(
        sqlalchemy_url(url),
        poolclass=NullPool,
        # A transaction is never left idle, migrations included (as db/pool.py's pools).
        connect_args={"server_settings": dict(SERVER_SETTINGS)},
    )
    try:
        with _driver_errors():
            yield made
    finally:
        await made.dispose()


async def current_revision(db: Db) -> str | None:
    """The revision the schema is at, as Alembic records it; None: never migrated."""
    if await db.fetchval("SELECT to_regclass('alembic_version')") is None:
        return None
    heads = sorted(row[0] for row in await db.fetch("SELECT version_num FROM alembic_version"))
    # One row, or none; several would be a branched history, which never matches a head.
    return " ".join(heads) or None


async def upgrade(url: str, revision: str = "head") -> tuple[str | None, str]:
    """Upgrade the database at ``url`` to ``revision``; returns (revision before, after)."""
    config = alembic_config()

    def run(connection: Connection) -> tuple[str | None, str]:
        connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
        before = _current(connection)
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
        after = _current(connection)
        assert after is not None
        return before, after

    async with engine(url) as migrating, migrating.begin() as conn:
        return await conn.run_sync(run)


async def check_migrated(db: Db) -> None:
    """Raise :class:`DatabaseNotMigrated` unless the schema is exactly at this release's head."""
    current = await current_revision(db)
    expected = head_revision()
    if current != expected:
        raise DatabaseNotMigrated(current, expected)


async def autogenerate(url: str, message: str) -> None:  # pragma: no cover
    """Developer helper behind ``scripts/new_migration.py``: a revision from the difference
    between the models and the schema at ``url``."""
    config = alembic_config()

    def generate(connection: Connection) -> None:
        config.attributes["connection"] = connection
        command.revision(config, message=message, autogenerate=True)

    async with engine(url) as migrating, migrating.begin() as conn:
        await conn.run_sync(generate)
