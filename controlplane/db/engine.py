"""Connections: the SQLAlchemy async engine for domain code, sessions, and the URL in use."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from controlplane.db.urls import sqlalchemy_url


def create_engine(url: str, *, pool_size: int = 10) -> AsyncEngine:
    return create_async_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        # A replica must never leave a transaction idle: it holds back xmin and bloats every
        # SKIP LOCKED table. The server enforces it even if our code slips.
        connect_args={"server_settings": {"idle_in_transaction_session_timeout": "60000"}},
    )


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


@asynccontextmanager
async def transaction(
    sessions: async_sessionmaker[AsyncSession],
) -> AsyncIterator[AsyncSession]:
    """One short transaction: commit on success, roll back on any error."""
    async with sessions() as session, session.begin():
        yield session
