"""Schema migrations: upgrade, inspect, and the start-up check that refuses old schemas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

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


async def current_revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as conn:
        return await conn.run_sync(_current)


async def upgrade(engine: AsyncEngine, revision: str = "head") -> tuple[str | None, str]:
    """Upgrade to ``revision``; returns (revision before, revision after)."""
    config = alembic_config()

    def run(connection: Connection) -> tuple[str | None, str]:
        connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
        before = _current(connection)
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
        after = _current(connection)
        assert after is not None
        return before, after

    async with engine.begin() as conn:
        return await conn.run_sync(run)


async def check_migrated(engine: AsyncEngine) -> None:
    """Raise :class:`DatabaseNotMigrated` unless the schema is exactly at this release's head."""
    current = await current_revision(engine)
    expected = head_revision()
    if current != expected:
        raise DatabaseNotMigrated(current, expected)


def autogenerate(engine_sync_connection: Any, message: str) -> None:  # pragma: no cover
    """Developer helper behind ``scripts/new_migration.py``."""
    config = alembic_config()
    config.attributes["connection"] = engine_sync_connection
    command.revision(config, message=message, autogenerate=True)
