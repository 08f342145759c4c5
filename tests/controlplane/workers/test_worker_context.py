"""A worker's bounded context: compaction before the window fills, a context_length_exceeded
answer compacted and tried once more, the prefix byte-identical throughout, and the same
context after a reopen.

Real parts throughout: a real ``WorkerService`` over real Postgres, a ``LocalDevice`` that
reads real files, and the fake OpenAI server over HTTP with a real window (it refuses a
request over it as providers do).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import openai
import pytest

from controlplane.gateway.queue import CommandQueue
from controlplane.llm.transcript import message_content
from controlplane.settings import LlmSettings
from controlplane.workers.session import PROGRESS_NOTE, WorkerSession
from tests.fakes.openai_server import (
    FAKE_MODEL,
    ChatRequest,
    FakeOpenAIServer,
    Reply,
    ToolCall,
    fault,
)
from tests.support.helpers import assert_eventually
from tests.support.worker_harness import (  # noqa: F401 - fixtures
    LocalDevice,
    device_fixture,
    dsn_fixture,
    queue_fixture,
    report_reply,
    state_is,
    ticket,
    workers_running,
)

WINDOW = 32_768
STEPS = 300  # tool calls with a 50 KiB output each
OUTPUT_BYTES = 50 * 1024
LIMITS: dict[str, Any] = {"max_turns": 1000, "token_budget": 10**10}
Callback = Callable[[ChatRequest], Reply]


def _text_file(path: Path, size: int) -> Path:
    """``size`` bytes of text in lines of 80, each line numbered."""
    lines = []
    total = 0
    number = 0
    while total < size:
        line = f"{number:06d} " + "the quick brown fox jumps over the lazy dog " * 2
        line = line[:79] + "\n"
        lines.append(line)
        total += len(line)
        number += 1
    path.write_text("".join(lines)[:size])
    return path


def _worker_calls(fake: FakeOpenAIServer) -> list[ChatRequest]:
    """The worker's own calls (with its tools), not the summary calls (which have none)."""
    return [r for r in fake.chat_requests if r.tools]


def _summary(request: ChatRequest) -> Reply:
    folded = request.last_user_message() or ""
    return Reply(
        content="Progress so far: read the file and its output again at growing offsets "
        f"({folded.count('job_output')} more calls folded in); nothing is wrong with it."
    )


async def _compactions(pool: asyncpg.Pool, ticket_id: str) -> list[dict[str, Any]]:
    rows = await pool.fetch(
        "SELECT m.role, m.content FROM session_messages m JOIN sessions s ON s.id = m.session_id "
        "WHERE s.ticket_id = $1 AND m.content ? 'compaction' ORDER BY m.seq",
        ticket_id,
    )
    assert {row["role"] for row in rows} <= {"system"}
    return [message_content(row["content"])["compaction"] for row in rows]


async def _session_id(pool: asyncpg.Pool, ticket_id: str) -> str:
    session_id = await pool.fetchval(
        "SELECT id FROM sessions WHERE ticket_id = $1 AND kind = 'worker'", ticket_id
    )
    assert isinstance(session_id, str)
    return session_id


async def _reopened(pool: asyncpg.Pool, ticket_id: str) -> list[dict[str, Any]]:
    """The context a replica taking the session over would show the model."""
    async with pool.acquire() as conn:
        session, new = await WorkerSession.open(
            conn, await _session_id(pool, ticket_id), ticket_id=ticket_id, model=FAKE_MODEL
        )
    assert not new
    return session.context()


async def _completed(pool: asyncpg.Pool, ticket_id: str, timeout: float = 30) -> None:
    await assert_eventually(
        lambda: state_is(pool, ticket_id, "completed"), timeout=timeout, message="completed"
    )


async def _outcomes(pool: asyncpg.Pool) -> list[str]:
    rows = await pool.fetch("SELECT outcome FROM llm_calls ORDER BY created_at, id")
    return [row["outcome"] for row in rows]


def _prefix_is_stable(calls: list[ChatRequest], compactions: int) -> None:
    """The system prompt, the tools and the brief are the same in every call, and a call
    extends the one before unless a compaction came between them."""
    first = calls[0]
    prefix = json.dumps(first.messages[:2])
    tools = json.dumps(first.body["tools"])
    for call in calls:
        assert json.dumps(call.messages[:2]) == prefix
        assert json.dumps(call.body["tools"]) == tools
    breaks = sum(
        1
        for before, after in itertools.pairwise(calls)
        if after.messages[: len(before.messages)] != before.messages
    )
    assert breaks <= compactions


def _assert_replayed(calls: list[ChatRequest], reopened: list[dict[str, Any]]) -> None:
    """A reopened session shows what the model was last shown, then the answer to it."""
    last = calls[-1].messages[1:]
    assert reopened[: len(last)] == last
    assert [m["role"] for m in reopened[len(last) :]] == ["assistant", "tool"]


# -- the fake's window ---------------------------------------------------------------------


def test_the_fake_refuses_a_prompt_over_its_window() -> None:
    with FakeOpenAIServer(context_window=100) as server:
        server.respond_with(lambda request: "fine")
        client = server.openai_client()
        answer = client.chat.completions.create(
            model=FAKE_MODEL, messages=[{"role": "user", "content": "hi"}]
        )
        assert answer.choices[0].message.content == "fine"
        server.script("kept for the next call")
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model=FAKE_MODEL, messages=[{"role": "user", "content": "x" * 1000}]
            )
        assert refused.value.code == "context_length_exceeded"
        assert server.requests[-1].headers.get("x-should-retry") is None  # a request header
        assert server.pending_replies == 1  # the script item was not taken
        server.context_window = None
        answer = client.chat.completions.create(
            model=FAKE_MODEL, messages=[{"role": "user", "content": "x" * 1000}]
        )
        assert answer.choices[0].message.content == "kept for the next call"


# -- the acceptance run --------------------------------------------------------------------


def _reader(path: str, steps: int) -> Callback:
    """The model: read ``path`` once, then its output (50 KiB at a time, each at its own
    offset so that no call repeats) ``steps`` times, then report ready."""
    state: dict[str, Any] = {"n": 0, "job": None}

    def answer(request: ChatRequest) -> Reply:
        if not request.tools:
            return _summary(request)
        n = state["n"]
        state["n"] += 1
        if n == 0:
            return Reply(tool_calls=[ToolCall("read_file", {"path": path})])
        if n == 1:
            found = re.search(r"cmd_[0-9a-z]+", str(request.messages[-1]["content"]))
            assert found, request.messages[-1]
            state["job"] = found.group()
        if n <= steps:
            arguments = {"job": state["job"], "offset": n - 1, "limit": OUTPUT_BYTES}
            return Reply(tool_calls=[ToolCall("job_output", arguments)])
        return report_reply("ready", f"read it {steps} times")

    return answer


async def test_300_steps_of_50kib_outputs_finish_within_a_32k_window(
    pool: asyncpg.Pool, queue: CommandQueue, device: LocalDevice, dsn: str, tmp_path: Path
) -> None:
    big = _text_file(tmp_path / "big.txt", OUTPUT_BYTES + STEPS)
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path))
    # No prefix-cache model: comparing each prompt with every earlier one is quadratic.
    with FakeOpenAIServer(context_window=WINDOW, cache_mode="off") as fake:
        fake.respond_with(_reader(big.name, STEPS))
        boundary = LlmSettings(worker_context_tokens=WINDOW)
        async with workers_running(pool, queue, fake, dsn, boundary=boundary, **LIMITS):
            await _completed(pool, ticket_id, timeout=240)
        calls = _worker_calls(fake)
        summaries = [r for r in fake.chat_requests if not r.tools]
        # Every request fit the window: none was refused.
        chats = [r for r in fake.requests if r.path.endswith("/chat/completions")]
        assert all(r.status == 200 for r in chats), [r.status for r in chats]
        for request in fake.chat_requests:
            tokens = fake.estimate_tokens(fake.prompt_text(request.messages, request.tools))
            assert tokens <= WINDOW
            if request.tools:  # the worker's calls stay under the share compaction keeps
                assert tokens <= WINDOW * 0.75
        assert set(await _outcomes(pool)) == {"ok"}
    assert len(calls) == STEPS + 2  # the read, the 300 outputs, the report
    newest = json.loads(calls[-1].messages[-1]["content"])
    assert len(newest["output"]) == OUTPUT_BYTES  # the newest output is shown whole
    compactions = await _compactions(pool, ticket_id)
    assert len(compactions) >= STEPS // 2
    steps = {step for c in compactions for step in c["steps"]}
    assert {"reduced", "summarised"} <= steps
    assert summaries  # the model wrote the progress notes
    assert any(m["content"].startswith(PROGRESS_NOTE) for m in calls[-1].messages[2:3])
    _prefix_is_stable(calls, len(compactions))
    _assert_replayed(calls, await _reopened(pool, ticket_id))


# -- a summary by hand, recall, and prefix caching -----------------------------------------


def _small_reader(path: str, steps: int) -> tuple[Callback, dict[str, Any]]:
    """The model: read ``path`` ``steps`` times (at growing offsets); once an output is shown
    reduced, recall its id once. Summary calls fail (a permanent error)."""
    state: dict[str, Any] = {"n": 0, "recalled": None, "recall": None}

    def answer(request: ChatRequest) -> Reply:
        if not request.tools:
            return Reply(error_status=400, error_message="summaries are broken today")
        if state["recalled"] and state["recall"] is None:
            state["recall"] = json.loads(request.messages[-1]["content"])
        if state["recalled"] is None:
            for message in request.messages:
                found = re.search(r"recall\(id='(msg_[0-9a-z]+)'", str(message.get("content")))
                if message.get("role") == "tool" and found:
                    state["recalled"] = found.group(1)
                    arguments = {"id": found.group(1), "offset": 1000}
                    return Reply(tool_calls=[ToolCall("recall", arguments)])
        n = state["n"]
        state["n"] += 1
        if n < steps:
            return Reply(tool_calls=[ToolCall("read_file", {"path": path, "offset": n})])
        return report_reply("ready", "read it all")

    return answer, state


async def test_a_failed_summary_call_falls_back_to_one_made_by_hand(
    pool: asyncpg.Pool, queue: CommandQueue, device: LocalDevice, dsn: str, tmp_path: Path
) -> None:
    window = 8192
    path = _text_file(tmp_path / "notes.txt", 20_000)
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path))
    with FakeOpenAIServer(context_window=window) as fake:
        callback, state = _small_reader(path.name, 30)
        fake.respond_with(callback)
        boundary = LlmSettings(worker_context_tokens=window)
        async with workers_running(pool, queue, fake, dsn, boundary=boundary, **LIMITS):
            await _completed(pool, ticket_id, timeout=60)
        calls = _worker_calls(fake)
        for request in fake.chat_requests:
            assert fake.estimate_tokens(fake.prompt_text(request.messages, request.tools)) <= window
        # Only the summary calls failed (they have no tools).
        for record in fake.requests:
            if not record.path.endswith("/chat/completions"):
                continue  # (the window's discovery: GET /props, /v1/models)
            body = record.json_body if isinstance(record.json_body, dict) else {}
            assert record.status == (200 if body.get("tools") else 400)
        usage = [r.usage for r in fake.requests if r.usage and r.status == 200]
        prefix = len(fake.prompt_text(calls[0].messages[:2], calls[0].tools))
        cached = (prefix // 4) // 64 * 64
    compactions = await _compactions(pool, ticket_id)
    assert any("summarised by hand" in c["steps"] for c in compactions)
    note = next(c["summary"] for c in compactions if c["summary"])
    assert "- read_file(" in note  # each call, its result's first line, its id
    assert "[msg_" in note
    assert "permanent" in await _outcomes(pool)  # the summary calls, on record
    # recall reads a reduced output back from the session.
    recall = state["recall"]
    assert recall is not None
    assert recall["id"] == state["recalled"]
    assert recall["offset"] == 1000
    stored = await pool.fetchval(
        "SELECT content FROM session_messages WHERE id = $1", state["recalled"]
    )
    original = message_content(stored)["message"]["content"]
    assert recall["size"] == len(original) > 3000
    assert recall["content"] == original[1000 : 1000 + 8000]
    # The prefix (tools, system prompt, brief) is cached in every call after the first.
    assert all(u["prompt_tokens_details"]["cached_tokens"] >= cached for u in usage[1:])
    _prefix_is_stable(calls, len(compactions))
    _assert_replayed(calls, await _reopened(pool, ticket_id))


# -- context_length_exceeded ----------------------------------------------------------------


def _refusing(path: str, *, refuse_from: int, once: bool) -> tuple[Callback, dict[str, Any]]:
    """The model: read ``path`` (at growing offsets); from the ``refuse_from``-th call on,
    the provider answers context_length_exceeded (once, or every time), then it reports."""
    state: dict[str, Any] = {"n": 0, "refused": []}

    def answer(request: ChatRequest) -> Reply:
        if not request.tools:
            return _summary(request)
        n = state["n"]
        if n >= refuse_from and (not once or not state["refused"]):
            state["refused"].append(request.index)
            item = fault("context_length")
            assert isinstance(item, Reply)
            return item
        state["n"] += 1
        if n < refuse_from + 2:
            return Reply(tool_calls=[ToolCall("read_file", {"path": path, "offset": n})])
        return report_reply("ready", "read it")

    return answer, state


async def test_a_context_length_answer_is_compacted_and_tried_once_more(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    path = _text_file(tmp_path / "notes.txt", 20_000)
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path))
    callback, state = _refusing(path.name, refuse_from=6, once=True)
    fake_llm.respond_with(callback)
    async with workers_running(pool, queue, fake_llm, dsn, **LIMITS):
        await _completed(pool, ticket_id)
    outcomes = await _outcomes(pool)
    assert outcomes.count("context") == 1
    (compaction,) = await _compactions(pool, ticket_id)
    assert compaction["forced"] is True
    assert compaction["tokens_after"] <= compaction["tokens_before"] // 2
    calls = _worker_calls(fake_llm)
    (refused,) = state["refused"]
    before = fake_llm.chat_requests[refused]
    after = next(r for r in calls if r.index > refused)
    assert after.messages[:2] == before.messages[:2]  # the prefix stays
    assert after.messages[2]["content"].startswith(PROGRESS_NOTE)
    assert after.messages[-1] == before.messages[-1]  # the newest turn stays whole
    _prefix_is_stable(calls, 1)
    _assert_replayed(calls, await _reopened(pool, ticket_id))


async def test_a_context_length_answer_after_compacting_ends_the_round_blocked(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    path = _text_file(tmp_path / "notes.txt", 20_000)
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path))
    callback, _ = _refusing(path.name, refuse_from=4, once=False)
    fake_llm.respond_with(callback)
    async with workers_running(pool, queue, fake_llm, dsn, **LIMITS):
        await assert_eventually(
            lambda: state_is(pool, ticket_id, "waiting_human", "blocked"), timeout=30
        )
    summary = await pool.fetchval(
        "SELECT summary FROM reports WHERE ticket_id = $1 AND status = 'blocked'", ticket_id
    )
    assert "(context)" in summary
    # Compacted once, harder, and tried once more: two refusals, then the round ended.
    assert (await _outcomes(pool)).count("context") == 2
    (compaction,) = await _compactions(pool, ticket_id)
    assert compaction["forced"] is True
