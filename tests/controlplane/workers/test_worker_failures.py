"""A worker round that fails is its ticket's failure: retried with backoff, then blocked.

Attacks: a model that answers garbage every time, a model that is down, and a bug in our own
code while handling an answer. On the old code each of these left the round's lease to
expire and retried it every lease period, forever, with nobody told. Now each failed round
is on record (``item_failures``), the next one waits out a backoff, and after
``workers.failed_rounds_limit`` in a row the ticket ends blocked: the thread is told the
cause in one line, the admin channel once, and ``superagent status`` lists it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import asyncpg
import pytest
from click.testing import CliRunner

from controlplane.gateway.queue import CommandQueue
from controlplane.settings import LlmSettings
from controlplane.workers.service import WorkerService
from tests.fakes.openai_server import (
    ChatRequest,
    FakeOpenAIServer,
    Reply,
    ToolCall,
    fault,
)
from tests.support.helpers import assert_eventually
from tests.support.worker_harness import (  # noqa: F401 - fixtures
    LocalDevice,
    client_for,
    device_fixture,
    dsn_fixture,
    queue_fixture,
    replies_on,
    report_reply,
    settings_for,
    state_is,
    ticket,
)

QUICK = LlmSettings(attempts=1, retry_base_seconds=0.01, retry_cap_seconds=0.1, timeout_seconds=2.0)
LIMIT = 3
ADMIN = "web:admin"


@contextlib.asynccontextmanager
async def _service(
    pool: asyncpg.Pool, queue: CommandQueue, llm: FakeOpenAIServer, dsn: str, **limits: Any
) -> AsyncIterator[WorkerService]:
    settings = settings_for(
        llm, boundary=QUICK, failed_rounds_limit=LIMIT, retry_base_seconds=0.2, **limits
    )
    settings.watchdog.admin_thread = ADMIN
    service = WorkerService(pool, queue, client_for(llm), settings, owner="replica-a", dsn=dsn)
    await service.start()
    try:
        yield service
    finally:
        await service.stop(10)


async def _failures(pool: asyncpg.Pool, ticket_id: str) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT error_class, error, quarantined FROM item_failures WHERE item_id = $1 "
        "ORDER BY created_at, id",
        ticket_id,
    )


async def _admin_alerts(pool: asyncpg.Pool) -> list[str]:
    rows = await pool.fetch(
        "SELECT e.payload->>'text' AS text FROM effects e "
        "JOIN threads t ON t.id = e.payload->>'thread_id' "
        "WHERE e.kind = 'reply' AND t.source = 'web' AND t.external_id = 'admin'"
    )
    return [row["text"] for row in rows]


async def _blocked(pool: asyncpg.Pool, ticket_id: str) -> bool:
    return await state_is(pool, ticket_id, "waiting_human", "blocked")


@pytest.mark.parametrize(
    ("answer", "expected"),
    [(fault("empty_choices"), "malformed"), (fault("server_error"), "transient")],
    ids=["malformed", "model-down"],
)
async def test_a_model_that_keeps_failing_blocks_the_ticket_after_the_limit_and_says_why(
    answer: Reply,
    expected: str,
    pool: asyncpg.Pool,
    queue: CommandQueue,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    device: LocalDevice,
    tmp_path: Path,
) -> None:
    fake_llm.respond_with(lambda request: answer)
    ticket_id, thread_id = await ticket(pool, device, workdir=str(tmp_path))
    async with _service(pool, queue, fake_llm, dsn) as service:
        # Between failed rounds the ticket waits out a backoff, visibly.
        await assert_eventually(
            lambda: state_is(pool, ticket_id, "open", "retrying"),
            timeout=20,
            message="the ticket waiting to retry its failed round",
        )
        await assert_eventually(
            lambda: _blocked(pool, ticket_id), timeout=30, message="the ticket blocked"
        )
        calls = len(fake_llm.chat_requests)
        await asyncio.sleep(1.5)  # several backoffs' worth: nothing more is tried
        assert len(fake_llm.chat_requests) == calls == LIMIT  # one call per round, bounded
        assert not service.task.done(), "the worker service ended"

    failures = await _failures(pool, ticket_id)
    assert [f["error_class"] for f in failures] == [expected] * LIMIT
    assert [f["quarantined"] for f in failures] == [False] * (LIMIT - 1) + [True]
    said = await replies_on(pool, thread_id)
    assert len(said) == 1, said  # one line, once
    assert f"{ticket_id} is blocked" in said[0]
    assert f"{expected}:" in said[0]
    assert f"superagent tickets retry {ticket_id}" in said[0]
    alerts = await _admin_alerts(pool)
    assert len(alerts) == 1
    assert ticket_id in alerts[0]
    assert expected in alerts[0]
    report = await pool.fetchrow(
        "SELECT status, summary FROM reports WHERE ticket_id = $1", ticket_id
    )
    assert report is not None
    assert report["status"] == "blocked"
    assert f"{LIMIT} rounds in a row failed" in report["summary"]


async def test_a_bug_in_our_code_fails_the_round_with_its_traceback_not_the_service(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    device: LocalDevice,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from controlplane.workers.tools import toolbox

    async def broken(self: Any, name: str, arguments: str, call_id: str) -> dict[str, Any]:
        return [][0]  # an IndexError in our own code

    monkeypatch.setattr(toolbox.WorkerToolbox, "call", broken)
    fake_llm.respond_with(lambda request: Reply(tool_calls=[ToolCall("shell", {"command": "ls"})]))
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path))
    caplog.set_level(logging.ERROR, logger="controlplane.tickets.retries")
    async with _service(pool, queue, fake_llm, dsn) as service:
        await assert_eventually(
            lambda: _blocked(pool, ticket_id), timeout=30, message="the ticket blocked"
        )
        assert not service.task.done(), "the worker service ended"
    failures = await _failures(pool, ticket_id)
    assert {f["error_class"] for f in failures} == {"internal"}
    assert "IndexError" in failures[0]["error"]
    assert "Traceback" in caplog.text
    assert "IndexError" in caplog.text


async def test_an_answer_that_works_starts_the_count_over(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    device: LocalDevice,
    tmp_path: Path,
) -> None:
    # Two failures, a step that works, two more failures, then a report: never blocked.
    garbage = cast(Reply, fault("empty_choices"))
    script = iter(
        [garbage] * 2
        + [Reply(tool_calls=[ToolCall("shell", {"command": "echo hi"})])]
        + [garbage] * 2
    )

    def answer(request: ChatRequest) -> Reply:
        return next(script, report_reply("ready", "done"))

    fake_llm.respond_with(answer)
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path))
    async with _service(pool, queue, fake_llm, dsn):
        await assert_eventually(
            lambda: state_is(pool, ticket_id, "completed"), timeout=40, message="completed"
        )
    assert len(await _failures(pool, ticket_id)) == 4
    assert await pool.fetchval("SELECT failed_rounds FROM tickets WHERE id = $1", ticket_id) == 0


async def test_retry_releases_a_blocked_ticket_and_status_lists_what_is_quarantined(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    device: LocalDevice,
    tmp_path: Path,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from controlplane.cli.main import cli

    healthy = False

    def answer(request: ChatRequest) -> Reply:
        return report_reply("ready", "done") if healthy else fault("empty_choices")  # type: ignore[return-value]

    fake_llm.respond_with(answer)
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path))
    monkeypatch.setenv("DATABASE_URL", database_url)
    runner = CliRunner()
    async with _service(pool, queue, fake_llm, dsn):
        await assert_eventually(
            lambda: _blocked(pool, ticket_id), timeout=30, message="the ticket blocked"
        )
        shown = await asyncio.to_thread(runner.invoke, cli, ["status"])
        assert shown.exit_code == 0, shown.output
        assert "1 blocked ticket(s)" in shown.output
        assert ticket_id in shown.output
        assert "malformed" in shown.output
        assert f"release: superagent tickets retry {ticket_id}" in shown.output

        healthy = True
        retried = await asyncio.to_thread(runner.invoke, cli, ["tickets", "retry", ticket_id])
        assert retried.exit_code == 0, retried.output
        await assert_eventually(
            lambda: state_is(pool, ticket_id, "completed"), timeout=30, message="completed"
        )
        shown = await asyncio.to_thread(runner.invoke, cli, ["status"])
        assert "quarantined:    nothing" in shown.output, shown.output


async def test_metrics_count_failures_by_loop_and_class(pool: asyncpg.Pool) -> None:
    from controlplane import failures
    from controlplane.llm.errors import Malformed
    from controlplane.metrics import GROUPS

    await failures.record(pool, "router", "trg_x", Malformed("no choices"))
    await failures.record(pool, "workers", "tkt_x", IndexError("list index out of range"))
    await failures.record(pool, "workers", "tkt_x", IndexError("again"), quarantined=True)
    async with pool.acquire() as conn:
        metrics = await GROUPS["failures"](conn)
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for metric in metrics
        for sample in metric.samples
    }
    internal = (("class", "internal"), ("loop", "workers"))
    assert samples[("superagent_item_failures_total", internal)] == 2
    assert samples[("superagent_item_quarantines_total", internal)] == 1
    assert (
        samples[("superagent_item_failures_total", (("class", "malformed"), ("loop", "router")))]
        == 1
    )


async def test_a_watchdog_check_that_raises_fails_alone(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch, fake_llm: FakeOpenAIServer
) -> None:
    from controlplane.watchdog import service

    ran: list[str] = []

    async def broken(pool: asyncpg.Pool, settings: Any) -> list[Any]:
        raise KeyError("a bug in a check")

    async def counted(pool: asyncpg.Pool, settings: Any) -> list[Any]:
        ran.append("workers")
        return []

    monkeypatch.setattr(
        service,
        "CHECKS",
        [(broken, ("replica_silent",)), (counted, ("stalled",))],
    )
    watchdog = service.Watchdog(pool, settings_for(fake_llm), None)
    await watchdog.check_once()
    assert ran == ["workers"]  # the check after the broken one still ran
    row = await pool.fetchrow("SELECT loop, item_id, error_class, error FROM item_failures")
    assert row is not None
    assert tuple(row)[:3] == ("watchdog", "broken", "internal")
    assert "KeyError" in row["error"]
    alive = await pool.fetchval("SELECT expires_at > now() FROM leases WHERE name = 'watchdog'")
    assert alive is True  # the pass is marked: superagent status shows the watchdog
