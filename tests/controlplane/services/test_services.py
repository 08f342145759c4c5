"""The Service base and the critical loop: transient errors retry, bugs stop loudly."""

from __future__ import annotations

import asyncio
import logging

import asyncpg
import pytest

from controlplane.db import outage
from controlplane.db.urls import asyncpg_dsn
from controlplane.errors import TransientError
from controlplane.services import (
    Service,
    critical_loop,
    is_transient_or_database,
    run_services,
)
from tests.support.helpers import assert_eventually


async def test_transient_errors_are_retried_with_backoff() -> None:
    stopping = asyncio.Event()
    calls = 0

    async def step() -> None:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionResetError("peer went away")
        stopping.set()

    await asyncio.wait_for(critical_loop("t", step, stopping), 10)
    assert calls == 3


async def test_other_errors_fail_loudly() -> None:
    stopping = asyncio.Event()

    async def step() -> None:
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        await asyncio.wait_for(critical_loop("t", step, stopping), 10)


async def test_a_loop_whose_passes_are_queries_retries_a_failing_statement_too() -> None:
    """``retry=is_transient_or_database`` (the workers', the watchdog's): a statement the
    database refuses is retried like an outage; a bug still ends the loop."""
    stopping = asyncio.Event()
    errors: list[Exception] = [
        asyncpg.exceptions.UndefinedTableError('relation "x" does not exist'),
        KeyError("a bug"),
    ]

    async def step() -> None:
        raise errors.pop(0)

    with pytest.raises(KeyError):
        await asyncio.wait_for(
            critical_loop("t", step, stopping, retry=is_transient_or_database), 10
        )
    assert errors == []


class Ticker(Service):
    name = "ticker"

    def __init__(self, fail_after: int | None = None) -> None:
        super().__init__()
        self.ticks = 0
        self.fail_after = fail_after
        self.stopped_cleanly = False

    async def run(self) -> None:
        async def step() -> None:
            self.ticks += 1
            if self.fail_after is not None and self.ticks >= self.fail_after:
                raise RuntimeError("ticker broke")
            await asyncio.sleep(0.01)

        await critical_loop(self.name, step, self.stopping)
        self.stopped_cleanly = True


class Stubborn(Service):
    """Ignores stop requests: run_services must cancel it within the bound."""

    name = "stubborn"

    async def run(self) -> None:
        await asyncio.Event().wait()


async def test_run_services_stops_in_order_on_request() -> None:
    stop = asyncio.Event()
    ticker = Ticker()
    task = asyncio.create_task(run_services([ticker], stop, shutdown_timeout=2))
    await asyncio.sleep(0.1)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert ticker.ticks > 0
    assert ticker.stopped_cleanly


async def test_a_failing_service_brings_run_services_down_and_stops_the_rest() -> None:
    healthy = Ticker()
    broken = Ticker(fail_after=3)
    with pytest.raises(RuntimeError, match="ticker broke"):
        await asyncio.wait_for(run_services([healthy, broken], asyncio.Event()), 5)
    assert healthy.stopped_cleanly


async def test_shutdown_is_bounded_even_when_a_service_ignores_stop() -> None:
    stop = asyncio.Event()
    stubborn = Stubborn()
    task = asyncio.create_task(run_services([stubborn], stop, shutdown_timeout=0.5))
    await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, 3)
    assert stubborn.task.cancelled()


async def test_transient_error_class_is_transient() -> None:
    stopping = asyncio.Event()
    seen = 0

    async def step() -> None:
        nonlocal seen
        seen += 1
        if seen == 1:
            raise TransientError("try later")
        stopping.set()

    await asyncio.wait_for(critical_loop("t", step, stopping), 10)
    assert seen == 2


class Deaf(Service):
    """Swallows its (first) cancellation too: stopping must still return, within a bound."""

    name = "deaf"

    async def run(self) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(3600)


async def test_a_loop_that_ignores_cancellation_does_not_hold_up_the_stop() -> None:
    stop = asyncio.Event()
    deaf = Deaf()
    task = asyncio.create_task(run_services([deaf], stop, shutdown_timeout=0.5))
    await asyncio.sleep(0.05)
    stop.set()
    started = asyncio.get_running_loop().time()
    await asyncio.wait_for(task, 5)
    assert asyncio.get_running_loop().time() - started < 2.5
    deaf.task.cancel()  # the second one it heeds
    with pytest.raises(asyncio.CancelledError):
        await deaf.task


async def test_a_database_outage_is_one_episode_in_the_log(
    caplog: pytest.LogCaptureFixture, database_url: str
) -> None:
    # Nothing listens on port 1: the probe fails, as it does while Postgres is down.
    outage.configure("postgresql://nobody@127.0.0.1:1/none")
    try:
        stopping = asyncio.Event()
        calls = 0

        async def step() -> None:
            nonlocal calls
            calls += 1
            if calls == 6:
                stopping.set()
            raise ConnectionRefusedError("connection refused")

        with caplog.at_level(logging.DEBUG):
            await asyncio.wait_for(
                asyncio.gather(
                    critical_loop("a", step, stopping, backoff_cap=0.05),
                    critical_loop("b", step, stopping, backoff_cap=0.05),
                ),
                20,
            )
            assert outage.down()
            # Postgres answers again: the watch ends the episode at its next probe.
            outage._episode.dsn = asyncpg_dsn(database_url)
            done = asyncio.Event()
            watch = asyncio.create_task(outage.watch(done, exit_after=0))
            await assert_eventually(lambda: not outage.down(), timeout=5)
            done.set()
            await watch
        lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert [line for line in lines if "database unreachable" in line], lines
        assert len(lines) == 2, lines  # the start and the end, nothing per loop or retry
        assert "database back" in lines[1]
    finally:
        outage.configure(None)


async def test_other_connection_errors_are_not_taken_for_an_outage(
    caplog: pytest.LogCaptureFixture, database_url: str
) -> None:
    # A Slack socket refused while Postgres answers: that loop's own warning, no episode.
    outage.configure(asyncpg_dsn(database_url))
    try:
        stopping = asyncio.Event()

        async def step() -> None:
            stopping.set()
            raise ConnectionRefusedError("slack refused")

        with caplog.at_level(logging.WARNING):
            await asyncio.wait_for(critical_loop("slack", step, stopping), 10)
        assert not outage.down()
        assert any("slack: transient error" in r.getMessage() for r in caplog.records)
    finally:
        outage.configure(None)


async def test_an_outage_past_the_configured_deadline_ends_the_process() -> None:
    outage.configure("postgresql://nobody@127.0.0.1:1/none")
    try:
        stopping = asyncio.Event()

        async def step() -> None:
            stopping.set()
            raise ConnectionRefusedError("connection refused")

        await critical_loop("a", step, stopping)
        assert outage.down()
        with pytest.raises(outage.DatabaseGoneError, match="OUTAGE_EXIT_SECONDS"):
            await asyncio.wait_for(outage.watch(asyncio.Event(), exit_after=0.5), 10)
    finally:
        outage.configure(None)
