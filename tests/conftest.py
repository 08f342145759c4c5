"""Shared fixtures: a real Postgres (one fresh database per test worker) and the fake LLM.

Postgres comes from ``TEST_DATABASE_URL`` when set, otherwise from the ``pgserver`` wheel,
started once per test run and shared by the xdist workers (pgserver coordinates them).

Every collected test is marked ``pg`` when it needs Postgres and ``slow`` when it starts
processes, from what its code and fixtures reach (tests/support/markers.py says how);
``scripts/test --quick`` runs the tests that are neither.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from controlplane.db import migrate
from controlplane.db.pool import create_pool
from controlplane.db.urls import asyncpg_dsn
from endpointd.process.executor import Zygote
from tests.fakes.openai_server import fake_llm  # noqa: F401 - fixture
from tests.support import markers
from tests.support.database import create_engine, session_factory, with_database
from tests.support.helpers import assert_eventually

REPO = Path(__file__).resolve().parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--real-model",
        action="store_true",
        help="Also run the tests marked real_model (a real model in llama-server, from "
        "scripts/real_model's cache; docs/testing.md). Without it they are deselected.",
    )


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test ``pg`` when it needs Postgres, ``slow`` when it starts processes;
    leave out the real-model tier unless ``--real-model`` asks for it."""
    for item in items:
        markers.mark(item)
    if not config.getoption("real_model"):
        tier = [item for item in items if item.get_closest_marker("real_model")]
        if tier:
            config.hook.pytest_deselected(items=tier)
            items[:] = [item for item in items if not item.get_closest_marker("real_model")]


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """URL of a Postgres server where tests may create databases."""
    external = os.environ.get("TEST_DATABASE_URL")
    if external:
        yield external
        return
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    from pgserver.postgres_server import get_server

    data = Path(tempfile.gettempdir()) / f"superagent-test-pg-{os.getuid()}"
    server = get_server(data, cleanup_mode="stop")
    yield server.get_uri()
    server.cleanup()


@pytest.fixture
async def empty_database(pg_server_url: str, worker_id: str) -> AsyncIterator[str]:
    """A database with nothing in it, not even the schema (dropped afterwards)."""
    name = f"sa_empty_{worker_id}_{os.getpid()}"
    admin = await asyncpg.connect(asyncpg_dsn(pg_server_url))
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    yield with_database(pg_server_url, name)
    admin = await asyncpg.connect(asyncpg_dsn(pg_server_url))
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.close()


@pytest.fixture(scope="session")
async def database_url(pg_server_url: str, worker_id: str) -> AsyncIterator[str]:
    """A fresh, migrated database for this test worker, dropped at the end."""
    name = f"sa_test_{worker_id}_{os.getpid()}"
    admin = await asyncpg.connect(asyncpg_dsn(pg_server_url))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = with_database(pg_server_url, name)
    await migrate.upgrade(url)
    yield url
    admin = await asyncpg.connect(asyncpg_dsn(pg_server_url))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture(scope="session")
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    """A SQLAlchemy engine, for tests that seed rows through the models (``db``)."""
    engine = create_engine(database_url, pool_size=5)
    yield engine
    await engine.dispose()


@pytest.fixture
async def db(engine: AsyncEngine, database_url: str) -> async_sessionmaker[AsyncSession]:
    """Session factory over an emptied database (every table truncated before the test)."""
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        tables = await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
            "AND tablename <> 'alembic_version'"
        )
        if tables:
            names = ", ".join(f'"{t["tablename"]}"' for t in tables)
            await conn.execute(f"TRUNCATE {names} CASCADE")
    finally:
        await conn.close()
    return session_factory(engine)


@pytest.fixture
async def pool(
    db: async_sessionmaker[AsyncSession], database_url: str
) -> AsyncIterator[asyncpg.Pool]:
    """A raw asyncpg pool (as the hot paths use) over the emptied database of ``db``."""
    pool = await create_pool(asyncpg_dsn(database_url))
    yield pool
    await pool.close()


@pytest.fixture
async def zygote() -> AsyncIterator[Zygote]:
    """A started endpointd zygote (pre-imported supervisor forker), stopped afterwards."""
    z = Zygote()
    z.ensure_started()
    try:
        await assert_eventually(z.ready, timeout=20, message="the zygote never became ready")
        yield z
    finally:
        z.stop()
