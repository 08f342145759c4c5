"""The outbox against a real Postgres: exactly-once across runners, generations, retries,
postponement, waking, and a runner killed with SIGKILL mid-execution."""

from __future__ import annotations

import asyncio
import collections
import os
import random
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.db.urls import asyncpg_dsn
from controlplane.effects import (
    ClaimedEffect,
    Handlers,
    Postpone,
    enqueue,
    enqueue_many,
)
from controlplane.effects.runner import EffectRunner
from controlplane.settings import EffectsSettings
from tests.conftest import REPO
from tests.support.database import enqueue_in
from tests.support.helpers import assert_eventually

HandlerFn = Callable[[ClaimedEffect], Awaitable[None]]


@asynccontextmanager
async def running(
    database_url: str, handlers: dict[str, HandlerFn], count: int = 1, **settings: Any
) -> AsyncIterator[list[EffectRunner]]:
    registry = Handlers()
    for kind, handler in handlers.items():
        registry.register(kind, handler)
    config = EffectsSettings.model_construct(**{**EffectsSettings().model_dump(), **settings})
    runners = [
        EffectRunner(asyncpg_dsn(database_url), registry, config, owner=f"runner-{i}")
        for i in range(count)
    ]
    for runner in runners:
        await runner.start()
    try:
        yield runners
    finally:
        for runner in runners:
            await runner.stop(10)


async def rows(database_url: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        return await conn.fetch("SELECT * FROM effects ORDER BY created_at")
    finally:
        await conn.close()


async def count_rows(database_url: str) -> int:
    return len(await rows(database_url))


async def test_effect_runs_after_commit_and_is_deleted(
    db: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    seen: list[dict[str, Any]] = []

    async def record(effect: ClaimedEffect) -> None:
        seen.append(effect.payload)

    async with running(database_url, {"note": record}):
        async with db() as session, session.begin():
            await enqueue_in(session, "note", "k1", {"text": "hello"})
            await asyncio.sleep(0.3)
            assert seen == [], "an effect must not run before its transaction commits"
        await assert_eventually(lambda: seen == [{"text": "hello"}])
        await assert_eventually(lambda: _is_zero(count_rows(database_url)))


async def _is_zero(value: Awaitable[int]) -> bool:
    return await value == 0


async def test_rolled_back_transaction_leaves_no_effect(
    db: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    seen: list[str] = []

    async def record(effect: ClaimedEffect) -> None:
        seen.append(effect.key)

    async with running(database_url, {"note": record}):

        async def decide_then_fail() -> None:
            async with db() as session, session.begin():
                await enqueue_in(session, "note", "gone", {})
                raise RuntimeError("decided otherwise")

        with pytest.raises(RuntimeError):
            await decide_then_fail()
        async with db() as session, session.begin():
            await enqueue_in(session, "note", "kept", {})
        await assert_eventually(lambda: seen == ["kept"])
    assert await count_rows(database_url) == 0


async def test_parallel_runners_execute_each_effect_exactly_once(
    db: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    executions: collections.Counter[str] = collections.Counter()
    total = 1500

    async def work(effect: ClaimedEffect) -> None:
        executions[effect.key] += 1
        if random.random() < 0.2:
            await asyncio.sleep(random.random() / 50)

    async with running(database_url, {"work": work}, count=4, batch_size=16, concurrency=8):
        conn = await asyncpg.connect(asyncpg_dsn(database_url))
        try:
            for start in range(0, total, 100):
                async with conn.transaction():
                    for i in range(start, start + 100):
                        await enqueue(conn, "work", f"job-{i}", {"i": i})
        finally:
            await conn.close()
        await assert_eventually(lambda: len(executions) == total, timeout=60)
        await assert_eventually(lambda: _is_zero(count_rows(database_url)), timeout=10)
    assert set(executions.values()) == {1}, [k for k, n in executions.items() if n > 1][:5]


async def test_payload_update_during_execution_survives_the_old_completion(
    db: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    release = asyncio.Event()
    started = asyncio.Event()
    runs: list[tuple[int, str]] = []
    concurrent = 0
    max_concurrent = 0

    async def slow(effect: ClaimedEffect) -> None:
        nonlocal concurrent, max_concurrent
        concurrent += 1
        max_concurrent = max(max_concurrent, concurrent)
        try:
            runs.append((effect.generation, effect.payload["v"]))
            started.set()
            if effect.generation == 1:
                await release.wait()
        finally:
            concurrent -= 1

    async with running(database_url, {"slow": slow}, count=2):
        async with db() as session, session.begin():
            await enqueue_in(session, "slow", "same", {"v": "old"})
        await asyncio.wait_for(started.wait(), 10)
        async with db() as session, session.begin():
            ref = await enqueue_in(session, "slow", "same", {"v": "new"})
        assert ref.generation == 2
        await asyncio.sleep(0.5)  # the second runner must not start "new" beside "old"
        assert runs == [(1, "old")]
        release.set()
        await assert_eventually(lambda: runs == [(1, "old"), (2, "new")])
        await assert_eventually(lambda: _is_zero(count_rows(database_url)))
    assert max_concurrent == 1


async def test_failures_back_off_record_the_error_and_park_as_dead(
    db: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    attempts: list[int] = []

    async def broken(effect: ClaimedEffect) -> None:
        attempts.append(effect.attempt)
        raise ValueError(f"remote said no ({effect.attempt})")

    async with running(
        database_url,
        {"broken": broken},
        backoff_base_seconds=0.05,
        backoff_max_seconds=0.2,
        max_attempts=3,
    ):
        async with db() as session, session.begin():
            await enqueue_in(session, "broken", "k", {})

        async def parked() -> bool:
            found = await rows(database_url)
            return len(found) == 1 and found[0]["dead_at"] is not None

        await assert_eventually(parked)
        await asyncio.sleep(0.5)
    assert attempts == [1, 2, 3]
    (row,) = await rows(database_url)
    assert row["attempts"] == 3
    assert "ValueError: remote said no (3)" in row["last_error"]
    assert row["locked_by"] is None


async def test_reenqueue_revives_a_dead_effect(
    db: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    outcome: list[str] = []

    async def flaky(effect: ClaimedEffect) -> None:
        if effect.payload["ok"]:
            outcome.append("done")
            return
        raise RuntimeError("nope")

    async with running(database_url, {"flaky": flaky}, max_attempts=1):
        async with db() as session, session.begin():
            await enqueue_in(session, "flaky", "k", {"ok": False})
        await assert_eventually(
            lambda: _first_dead(database_url), message="effect should be parked"
        )
        async with db() as session, session.begin():
            await enqueue_in(session, "flaky", "k", {"ok": True})
        await assert_eventually(lambda: outcome == ["done"])
        await assert_eventually(lambda: _is_zero(count_rows(database_url)))


async def _first_dead(database_url: str) -> bool:
    found = await rows(database_url)
    return bool(found) and found[0]["dead_at"] is not None


async def test_postpone_is_not_a_failure(
    db: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    seen: list[int] = []

    async def later(effect: ClaimedEffect) -> None:
        seen.append(effect.attempt)
        if len(seen) < 3:
            raise Postpone(0.05, "no free slot")

    async with running(database_url, {"later": later}, max_attempts=1):
        async with db() as session, session.begin():
            await enqueue_in(session, "later", "k", {})
        await assert_eventually(lambda: len(seen) == 3)
        await assert_eventually(lambda: _is_zero(count_rows(database_url)))
    # Postponements do not use up attempts: max_attempts=1 and still no dead row.
    assert seen == [1, 1, 1]


async def test_unknown_kind_is_recorded_not_crashing(
    db: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    async with running(database_url, {}, backoff_base_seconds=30):
        async with db() as session, session.begin():
            await enqueue_in(session, "mystery", "k", {})

        async def recorded() -> bool:
            found = await rows(database_url)
            return bool(found) and "no handler for effect kind 'mystery'" in (
                found[0]["last_error"] or ""
            )

        await assert_eventually(recorded)


async def test_notification_wakes_the_runner_without_polling(
    db: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    seen = asyncio.Event()

    async def mark(effect: ClaimedEffect) -> None:
        seen.set()

    # A one-hour poll interval: only LISTEN/NOTIFY can wake the runner in time.
    async with running(database_url, {"mark": mark}, poll_interval_seconds=3600):
        await asyncio.sleep(0.3)  # let the runner reach its wait
        async with db() as session, session.begin():
            await enqueue_in(session, "mark", "k", {})
        await asyncio.wait_for(seen.wait(), 10)


async def test_polling_finds_effects_written_without_notification(
    db: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    seen = asyncio.Event()

    async def mark(effect: ClaimedEffect) -> None:
        seen.set()

    async with running(database_url, {"mark": mark}, poll_interval_seconds=0.2):
        await asyncio.sleep(0.3)
        conn = await asyncpg.connect(asyncpg_dsn(database_url))
        try:
            await conn.execute(
                "INSERT INTO effects (id, kind, key, payload) VALUES "
                "('eff_manual000001', 'mark', 'k', '{}')"
            )
        finally:
            await conn.close()
        await asyncio.wait_for(seen.wait(), 10)


async def test_runner_killed_mid_execution_leaves_the_effect_for_another(
    db: async_sessionmaker[AsyncSession], database_url: str, tmp_path: Path
) -> None:
    child = subprocess.Popen(  # noqa: ASYNC220 - started once, then only polled
        [
            sys.executable,
            "-m",
            "tests.support.effects_child",
            asyncpg_dsn(database_url),
            str(tmp_path),
            "1.5",
        ],
        cwd=REPO,
        start_new_session=True,
    )
    try:
        async with db() as session, session.begin():
            ref = await enqueue_in(session, "block", "k", {"n": 1})
        marker = tmp_path / f"{ref.id}.started"
        await assert_eventually(marker.exists, timeout=30, message="child never started it")
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(10)

    (row,) = await rows(database_url)
    assert row["locked_by"] == "child"  # still claimed by the dead runner

    finished: list[int] = []

    async def block(effect: ClaimedEffect) -> None:
        finished.append(effect.attempt)

    async with running(database_url, {"block": block}, poll_interval_seconds=0.2):
        await assert_eventually(lambda: finished == [2], timeout=15)
        await assert_eventually(lambda: _is_zero(count_rows(database_url)))


async def test_enqueue_many_upserts_in_one_round_trip(
    db: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    seen: collections.Counter[tuple[str, int]] = collections.Counter()

    async def record(effect: ClaimedEffect) -> None:
        seen[(effect.key, effect.payload["v"])] += 1

    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        async with conn.transaction():
            refs = await enqueue_many(
                conn,
                [("many", "a", {"v": 1}), ("many", "b", {"v": 1}), ("many", "a", {"v": 2})],
            )
        assert refs[0].id == refs[2].id  # the same effect, written once
        assert {ref.id[:4] for ref in refs} == {"eff_"}
        async with running(database_url, {"many": record}):
            await assert_eventually(lambda: sum(seen.values()) == 2)
            await assert_eventually(lambda: _is_zero(count_rows(database_url)))
    finally:
        await conn.close()
    assert seen == {("a", 2): 1, ("b", 1): 1}
