"""The Service base and the critical loop: transient errors retry, bugs stop loudly."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.errors import TransientError
from controlplane.services import Service, critical_loop, run_services


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
    """Ignores stop requests: the supervisor must cancel it within the bound."""

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


async def test_a_failing_service_brings_the_supervisor_down_and_stops_the_rest() -> None:
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
