"""Workers: rounds with leases and slots, tools on a device, reports, waiting, limits.

Real Postgres and real subprocesses (``LocalDevice`` runs commands for real, taking them
from the real queue); the model is the fake OpenAI server, scripted per test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import asyncpg

from controlplane.gateway.queue import CommandQueue
from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer, Reply, ToolCall
from tests.support.helpers import assert_eventually
from tests.support.worker_harness import (  # noqa: F401 - fixtures
    LocalDevice,
    device_fixture,
    dsn_fixture,
    local_device,
    queue_fixture,
    ticket,
    ticket_state,
    workers_running,
)


def _tool_results(request: ChatRequest) -> list[dict[str, Any]]:
    return [json.loads(m["content"]) for m in request.messages if m.get("role") == "tool"]


async def _router_reports(pool: asyncpg.Pool, ticket_id: str) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT kind, text, thread_id FROM triggers WHERE source = 'agent' AND actor_id = $1 "
        "ORDER BY created_at",
        ticket_id,
    )


async def test_a_worker_runs_a_command_and_reports_ready(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    ticket_id, thread_id = await ticket(pool, device, workdir=str(tmp_path))
    fake_llm.script(
        Reply(tool_calls=[ToolCall("shell", {"command": "echo hello from $PWD"})]),
        Reply(tool_calls=[ToolCall("report", {"status": "ready", "summary": "said hello"})]),
    )
    async with workers_running(pool, queue, fake_llm, dsn):
        await assert_eventually(
            lambda: _state_is(pool, ticket_id, "completed"), timeout=30, message="completed"
        )
    second = fake_llm.requests[-1].json_body
    assert isinstance(second, dict)
    shell = json.loads(second["messages"][-1]["content"])
    assert shell["exit_code"] == 0
    assert shell["output"] == f"hello from {tmp_path}\n"
    # The first message is the brief: the ticket, its request and where to work.
    brief = second["messages"][1]["content"]
    assert ticket_id in brief
    assert str(tmp_path) in brief
    assert f"superagent/{ticket_id}" in brief
    (report,) = await _router_reports(pool, ticket_id)
    assert report["kind"] == "report.ready"
    assert report["thread_id"] == thread_id
    assert "said hello" in report["text"]
    assert "tokens" in report["text"]
    tokens = await pool.fetchval("SELECT tokens_used FROM tickets WHERE id = $1", ticket_id)
    assert tokens > 0
    # The slot is free again: the round ended with the report.
    assert (
        await pool.fetchval("SELECT outcome FROM assignments WHERE ticket_id = $1", ticket_id)
        == "ready"
    )


async def _state_is(pool: asyncpg.Pool, ticket_id: str, state: str) -> bool:
    return (await ticket_state(pool, ticket_id))[0] == state
