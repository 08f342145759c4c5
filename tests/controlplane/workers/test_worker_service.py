"""The workers' loop (``workers/service.py``): a pass that fails on the database, gone or
answering with an error, is retried after a backoff and the passes resume; a bug in a pass
(not the database's) ends the service loudly instead of limping on. (A round's own failure
is its ticket's, never the loop's: test_worker_failures.py.)
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg
import pytest

from controlplane.gateway.queue import CommandQueue
from controlplane.workers.service import WorkerService
from tests.fakes.openai_server import FakeOpenAIServer
from tests.support.helpers import assert_eventually
from tests.support.worker_harness import (  # noqa: F401 - fixtures
    dsn_fixture,
    queue_fixture,
    workers_running,
)


def _failing_housekeeping(monkeypatch: pytest.MonkeyPatch, errors: list[Exception]) -> list[str]:
    """Housekeeping raises ``errors`` one per pass, then works; returns a log of passes."""
    passes: list[str] = []
    housekeeping = WorkerService._housekeeping

    async def failing(self: WorkerService) -> None:
        if errors:
            passes.append("failed")
            raise errors.pop(0)
        await housekeeping(self)
        passes.append("ok")

    monkeypatch.setattr(WorkerService, "_housekeeping", failing)
    return passes


async def test_a_pass_failing_on_the_database_is_retried_and_the_passes_resume(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    passes = _failing_housekeeping(
        monkeypatch,
        [
            asyncpg.InterfaceError("connection is closed"),  # the database restarting
            ConnectionRefusedError("connection refused"),  # then away
            asyncpg.exceptions.UndefinedTableError('relation "tickets" does not exist'),
        ],
    )
    async with workers_running(pool, queue, fake_llm, dsn) as service:
        await assert_eventually(
            lambda: passes.count("ok") >= 2, timeout=15, message="passes after the failures"
        )
        assert not service.task.done(), "a failed pass ended the worker service"
    assert passes[:3] == ["failed"] * 3


async def test_a_bug_in_a_pass_ends_the_service_loudly(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR)
    _failing_housekeeping(monkeypatch, [KeyError("a bug in housekeeping")])
    service: Any
    async with workers_running(pool, queue, fake_llm, dsn) as service:
        await asyncio.wait_for(asyncio.wait([service.task]), 15)
        assert isinstance(service.task.exception(), KeyError)
    assert "workers: unexpected error, stopping the loop" in caplog.text
