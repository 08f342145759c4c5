"""A worker given tool calls written in the message text, as small local models write them.

Real parts: the scripted fake OpenAI server over HTTP, a real Postgres, the worker service,
and a device that runs its commands for real. A shell call or a report written in the text
runs like a native one; a name that is no tool, or a call that cannot be read, is answered
as an error and nothing reaches the device.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import asyncpg

from controlplane.gateway.queue import CommandQueue
from tests.fakes.openai_server import FakeOpenAIServer, Reply
from tests.support.helpers import assert_eventually
from tests.support.worker_harness import (  # noqa: F401 - fixtures
    LocalDevice,
    device_fixture,
    dsn_fixture,
    queue_fixture,
    report_reply,
    state_is,
    ticket,
    tool_results,
    workers_running,
)


def _js(value: Any) -> str:
    return json.dumps(value)


async def _completed(pool: asyncpg.Pool, ticket_id: str) -> None:
    await assert_eventually(
        lambda: state_is(pool, ticket_id, "completed"), timeout=20, message="the ticket completed"
    )


async def test_a_shell_call_and_a_report_written_in_the_text_run(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path))
    shell = {"name": "shell", "arguments": {"command": "echo written in text"}}
    report = {"name": "report", "arguments": {"status": "ready", "summary": "said it"}}
    fake_llm.script(
        Reply(content=f"Let me run it.\n```json\n{_js(shell)}\n```"),
        Reply(content=f"<tool_call>\n{_js(report)}\n</tool_call>"),
    )
    async with workers_running(pool, queue, fake_llm, dsn):
        await _completed(pool, ticket_id)
    assert device.shell_runs("echo written in text") == 1
    second = fake_llm.chat_requests[1]
    (ran,) = tool_results(second)
    assert ran["output"] == "written in text\n"
    # The model is shown its call as a call (the provider's own shape, nothing of ours in
    # it), and its prose as what it said.
    assistant = [m for m in second.messages if m.get("role") == "assistant"][-1]
    (shown,) = assistant["tool_calls"]
    assert set(shown) == {"id", "type", "function"}
    assert shown["function"]["name"] == "shell"
    assert json.loads(shown["function"]["arguments"]) == shell["arguments"]
    assert assistant["content"] == "Let me run it."
    # The transcript says which form each call came in; people see it in the timeline.
    from controlplane.workers.timeline import timeline

    found = await timeline(pool, ticket_id)
    calls = [e for r in found.rounds for e in r.entries if e.kind == "call"]
    assert [(c.tool, c.form) for c in calls] == [("shell", "fenced"), ("report", "tagged")]
    assert "fenced" in calls[0].heading


async def test_a_tool_that_does_not_exist_is_not_run_and_the_model_is_told(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path))
    fake_llm.script(
        Reply(content=_js({"name": "rm_rf", "parameters": {"path": "/"}})),
        report_reply("ready", "done"),
    )
    async with workers_running(pool, queue, fake_llm, dsn):
        await _completed(pool, ticket_id)
    (error,) = tool_results(fake_llm.chat_requests[1])
    assert "rm_rf" in error["error"]
    assert "shell" in error["error"]
    assert device.ran == []


async def test_an_unreadable_call_reaches_no_device_and_the_model_is_told(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path))
    fake_llm.script(
        # The JSON is broken (a quote left open): what the command would be is a guess.
        Reply(content='<tool_call>\n{"name": "shell", "arguments": {"command": "rm -rf build}}\n'),
        report_reply("ready", "done"),
    )
    async with workers_running(pool, queue, fake_llm, dsn):
        await _completed(pool, ticket_id)
    (error,) = tool_results(fake_llm.chat_requests[1])
    assert "shell" in error["error"]
    assert "could not be read" in error["error"]
    assert device.ran == []


async def test_two_forms_in_one_answer_run_nothing(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path))
    first = {"name": "shell", "arguments": {"command": "echo one"}}
    second = {"name": "shell", "arguments": {"command": "echo two"}}
    fake_llm.script(
        Reply(content=f"```json\n{_js(first)}\n```\nor maybe\n{_js(second)}"),
        report_reply("ready", "done"),
    )
    async with workers_running(pool, queue, fake_llm, dsn):
        await _completed(pool, ticket_id)
    (error,) = tool_results(fake_llm.chat_requests[1])
    assert "two forms" in error["error"]
    assert device.ran == []
