"""The one LISTEN helper (controlplane/db/listen.py) against the real Postgres.

A notification wakes it and reaches its channel's callback; a killed connection is noticed
and replaced, with the wake set once it listens again (what was sent meanwhile is lost, so
the waiter must look again); closing it ends its task; a database it cannot reach leaves it
polling, never raising, with one warning for the whole failure.
"""

from __future__ import annotations

import asyncio
import logging
import time

import asyncpg
import pytest

from controlplane.db.listen import listen
from controlplane.db.urls import asyncpg_dsn
from tests.support.helpers import assert_eventually, free_port

CHANNEL = "superagent_test_listen"
OTHER = "superagent_test_listen_other"


def _tasks(name: str) -> list[asyncio.Task[object]]:
    return [task for task in asyncio.all_tasks() if task.get_name() == f"listen:{name}"]


async def test_a_notification_wakes_it_and_the_poll_returns_without_one(
    pool: asyncpg.Pool, database_url: str
) -> None:
    async with listen(asyncpg_dsn(database_url), CHANNEL, name="t-wake") as listener:
        assert listener.listening
        assert await listener.wait(0)  # the connect wakes: what came before it is lost
        started = time.monotonic()
        assert not await listener.wait(0.2)  # the poll fallback: back with nothing new
        assert time.monotonic() - started >= 0.15
        await pool.execute("SELECT pg_notify($1, 'x')", CHANNEL)
        assert await listener.wait(10)
        assert not listener.wake.is_set()  # consumed by the wait
        stopping = asyncio.Event()
        stopping.set()
        assert not await listener.wait(10, unless=stopping)  # at once, and not woken


async def test_a_channels_callback_gets_its_payload(pool: asyncpg.Pool, database_url: str) -> None:
    heard: list[tuple[str, str]] = []
    async with listen(
        asyncpg_dsn(database_url),
        OTHER,
        on_notify={CHANNEL: lambda payload: heard.append((CHANNEL, payload))},
        name="t-callback",
    ) as listener:
        await listener.wait(0)
        await pool.execute("SELECT pg_notify($1, 'tkt_1')", CHANNEL)
        await pool.execute("SELECT pg_notify($1, 'ignored by callbacks')", OTHER)
        await assert_eventually(lambda: heard == [(CHANNEL, "tkt_1")])
        assert await listener.wait(10)  # both channels wake it


@pytest.mark.parametrize("from_pool", [False, True])
async def test_a_killed_connection_is_replaced_and_the_waiter_told(
    pool: asyncpg.Pool, database_url: str, from_pool: bool
) -> None:
    heard: list[str] = []
    events: list[str] = []
    source = pool if from_pool else asyncpg_dsn(database_url)
    async with listen(
        source,
        on_notify={CHANNEL: heard.append},
        on_connect=lambda: events.append("connected"),
        on_lost=lambda: events.append("lost"),
        name="t-reconnect",
    ) as listener:
        assert await listener.wait(0)
        first = listener.connection
        assert first is not None
        pid = first.get_server_pid()
        await pool.execute("SELECT pg_notify($1, 'before')", CHANNEL)
        await assert_eventually(lambda: heard == ["before"])
        assert await listener.wait(0)

        await pool.execute("SELECT pg_terminate_backend($1)", pid)
        await assert_eventually(
            lambda: listener.listening and listener.connection is not first,
            message="listening again on a new connection",
        )
        assert events == ["connected", "lost", "connected"]
        assert listener.wake.is_set()  # notifications may have been lost: look again
        again = listener.connection
        assert again is not None
        assert again.get_server_pid() != pid
        await pool.execute("SELECT pg_notify($1, 'after')", CHANNEL)
        await assert_eventually(lambda: heard == ["before", "after"])
    assert not listener.listening


async def test_close_ends_its_task_and_its_connection(
    pool: asyncpg.Pool, database_url: str
) -> None:
    listener = await listen(asyncpg_dsn(database_url), CHANNEL, name="t-close").start()
    connection = listener.connection
    assert connection is not None
    assert _tasks("t-close")
    await listener.close()
    assert not _tasks("t-close")
    assert connection.is_closed()
    assert listener.connection is None
    await listener.close()  # again: nothing to do

    # A pool's connection goes back to it, so the pool closes without waiting.
    from_pool = await listen(pool, CHANNEL, name="t-close-pool").start()
    assert from_pool.listening
    await from_pool.close()
    assert not _tasks("t-close-pool")
    await asyncio.wait_for(pool.close(), 10)


async def test_an_unreachable_database_leaves_it_polling_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="controlplane.db.listen")
    dsn = f"postgresql://nobody@127.0.0.1:{free_port()}/none"
    async with listen(dsn, CHANNEL, name="t-unreachable") as listener:
        assert not listener.listening
        started = time.monotonic()
        assert not await listener.wait(0.3)  # the poll still paces the waiter
        assert time.monotonic() - started >= 0.25
        await asyncio.sleep(2.0)  # a few retries
        assert _tasks("t-unreachable")  # still trying
    assert not _tasks("t-unreachable")
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "t-unreachable" in warnings[0].getMessage()
    assert warnings[0].exc_info is None  # a refused connection is no bug: no traceback
