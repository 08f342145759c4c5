"""The router's loop (``router/service.py``): a failed turn, or a bug before a batch was
taken, never ends it; failed turns back off (doubling, capped, with jitter) and a good
turn or a trigger set aside starts the backoff over.

Turn takers here are stand-ins, so each test shows the loop alone, on a real Postgres (the
pause flag, the LISTEN connection) under a real leadership.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest

from controlplane.db.urls import asyncpg_dsn
from controlplane.leadership import Leadership
from controlplane.router.router import TurnFailed
from controlplane.router.service import RouterService
from tests.support.helpers import assert_eventually

BASE = 0.02
CAP = 0.08
JITTER = 0.2  # superagent_shared.backoff's default


class _Script:
    """A turn taker that plays ``outcomes`` in order (an int: a turn that consumed that
    many events; an exception: raised), then consumes nothing."""

    def __init__(self, *outcomes: int | Exception) -> None:
        self.outcomes = list(outcomes)
        self.turns = 0

    async def turn(self, leading: Callable[[], bool] = lambda: True) -> int:
        self.turns += 1
        if not self.outcomes:
            return 0
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def _failed(trigger: str) -> TurnFailed:
    return TurnFailed([trigger], ValueError("a malformed answer"))


@contextlib.asynccontextmanager
async def _running(
    pool: asyncpg.Pool, database_url: str, script: _Script
) -> AsyncIterator[RouterService]:
    leadership = Leadership(pool, "me", lease_seconds=10, renew_seconds=1)
    service = RouterService(
        script, leadership, asyncpg_dsn(database_url), pool, retry_base=BASE, max_backoff=CAP
    )
    await leadership.start()
    await service.start()
    try:
        yield service
    finally:
        await service.stop()
        await leadership.stop()


def _near(wait: float, expected: float) -> bool:
    return expected * (1 - JITTER) - 1e-9 <= wait <= expected * (1 + JITTER) + 1e-9


async def test_failed_turns_back_off_and_a_good_turn_or_a_set_aside_starts_over(
    pool: asyncpg.Pool, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = _Script(
        *(_failed(f"trg_{n}") for n in range(4)),  # 4 failures: BASE, 2×, 4× (the cap), cap
        1,  # a good turn
        _failed("trg_a"),
        _failed("trg_poison"),  # set aside (below): its wait is the first step again,
        _failed("trg_b"),  # so the next failure waits the second
    )
    waits: list[tuple[str, float]] = []

    async def failed(self: Any, failure: TurnFailed, backoff: float) -> bool:
        waits.append((failure.trigger_ids[0], backoff))
        return failure.trigger_ids == ["trg_poison"]

    monkeypatch.setattr("controlplane.router.containment.Containment.failed", failed)
    async with _running(pool, database_url, script) as service:
        await assert_eventually(lambda: len(waits) == 7, timeout=15, message="7 failed turns")
        assert not service.task.done(), "a failed turn ended the router's loop"
    expected = [BASE, 2 * BASE, CAP, CAP, BASE, 2 * BASE, 2 * BASE]
    got = [wait for _, wait in waits]
    assert all(_near(w, e) for w, e in zip(got, expected, strict=True)), (got, expected)


async def test_a_bug_before_the_batch_is_taken_is_logged_and_the_loop_goes_on(
    pool: asyncpg.Pool, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    script = _Script(KeyError("a bug"), KeyError("a bug"), 1)
    async with _running(pool, database_url, script) as service:
        await assert_eventually(lambda: script.turns >= 4, timeout=15, message="turns")
        assert not service.task.done(), "a bug in a turn ended the router's loop"
    bugs = [r for r in caplog.records if "(a bug)" in r.getMessage()]
    assert len(bugs) == 2
    assert all(r.exc_info is not None for r in bugs)  # with the traceback
