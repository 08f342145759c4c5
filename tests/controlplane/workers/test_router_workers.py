"""Where the router meets the workers: reports come back as events, replies state the
cost, pass-through (and what happens without it), and the single-session baseline."""

from __future__ import annotations

import json
import re
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.domain import EffectKind
from controlplane.gateway.queue import CommandQueue
from controlplane.ingest.admission import Actor, Admission, SourceAdmission
from controlplane.ingest.intake import IncomingTrigger, Ingested, Intake, ThreadRef
from controlplane.router import batch as batches
from controlplane.router.router import Router
from controlplane.router.tools.core import Turn
from controlplane.tickets import reports
from controlplane.workers.subagent import Subagent
from superagent_shared.ids import new_id
from tests.fakes.openai_server import FAKE_MODEL, ChatRequest, FakeOpenAIServer, Reply, ToolCall
from tests.support.helpers import save_policy
from tests.support.worker_harness import (  # noqa: F401 - fixtures
    LocalDevice,
    device_fixture,
    local_device,
    queue_fixture,
    settings_for,
)

ALICE = Actor("u-1", "alice")
CI = Actor("ci-1", "ci-bot", is_bot=True)


@pytest.fixture
async def pool(pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession]) -> asyncpg.Pool:
    await save_policy(db, Admission(default=SourceAdmission(users=[ALICE.id])))  # by actor id
    return pool


async def _say(
    intake: Intake, thread: str, text: str, actor: Actor = ALICE, kind: str = "issue_comment"
) -> Ingested:
    return await intake.ingest(
        IncomingTrigger(
            source="github",
            external_id=new_id("msg"),
            thread=ThreadRef(thread, title="calc is broken"),
            actor=actor,
            kind=kind,
            text=text,
        )
    )


async def _ticket_on(pool: asyncpg.Pool, request: Ingested, device_id: str | None) -> str:
    ticket_id = new_id("tkt")
    await pool.execute(
        "INSERT INTO tickets (id, title, device_id) VALUES ($1, 'fix calc', $2)",
        ticket_id,
        device_id,
    )
    await pool.execute(
        "INSERT INTO mandates (id, ticket_id, kind, initiator_id, initiator_name, trigger_id, "
        "scope) VALUES ($1, $2, 'explicit', 'u-1', 'alice', $3, 'fix calc')",
        new_id("mnd"),
        ticket_id,
        request.trigger_id,
    )
    await pool.execute(
        "INSERT INTO subscriptions (thread_id, ticket_id) VALUES ($1, $2)",
        request.thread_id,
        ticket_id,
    )
    await pool.execute("UPDATE triggers SET routed_at = now() WHERE id = $1", request.trigger_id)
    return ticket_id


async def _replies(pool: asyncpg.Pool, thread_id: str) -> list[str]:
    rows = await pool.fetch(
        "SELECT payload FROM effects WHERE kind = $1 AND payload->>'thread_id' = $2 "
        "ORDER BY created_at",
        EffectKind.REPLY,
        thread_id,
    )
    return [
        (json.loads(r["payload"]) if isinstance(r["payload"], str) else r["payload"])["text"]
        for r in rows
    ]


def _replying(request: ChatRequest) -> Reply:
    """A router that answers every report on its thread, and reads nothing else."""
    if request.tool_results():
        return Reply(content="Done.")
    batch = request.last_user_message() or ""
    calls = []
    thread = None
    for line in batch.splitlines():
        if found := re.match(r"thread (thr_\w+)", line):
            thread = found[1]
        if "report.ready" in line:
            calls.append(ToolCall("reply", {"thread": thread, "text": "Done: see the PR."}))
    return Reply(tool_calls=calls) if calls else Reply(content="nothing")


async def test_a_report_reaches_the_router_and_the_reply_states_tokens_and_cost(
    pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    intake = Intake(pool)
    request = await _say(intake, f"acme/calc#{new_id('thr')}", "@superagent fix calc")
    ticket_id = await _ticket_on(pool, request, None)
    await pool.execute(
        "UPDATE tickets SET tokens_used = 12345, cost_usd = 0.0421 WHERE id = $1", ticket_id
    )
    state = await reports.finish(
        pool,
        ticket_id,
        None,
        {"status": "ready", "summary": "fixed", "pr_url": "https://github.com/acme/calc/pull/7"},
    )
    assert state == "ready"  # a pull request: done once it is merged
    fake_llm.respond_with(_replying)
    router = Router(pool, fake_llm.async_openai_client(), FAKE_MODEL, policy=intake.policy)
    assert await router.turn() >= 1
    batch = fake_llm.chat_requests[0].messages[-1]["content"]
    assert f"READY: {ticket_id}" in batch
    assert "pull request https://github.com/acme/calc/pull/7" in batch
    (reply,) = await _replies(pool, request.thread_id)
    assert reply.startswith("Done: see the PR.")
    assert "12,345 tokens" in reply
    assert "$0.0421" in reply


async def test_pass_through_sends_thread_events_to_the_ticket_and_not_to_the_router(
    pool: asyncpg.Pool,
) -> None:
    intake = Intake(pool)
    thread = f"acme/calc#{new_id('thr')}"
    request = await _say(intake, thread, "@superagent fix calc")
    ticket_id = await _ticket_on(pool, request, None)
    human = await _say(intake, thread, "also check subtraction")
    assert human.route == "subscribers"
    assert human.tickets == (ticket_id,)
    ci = await _say(intake, thread, "CI failed", actor=CI, kind="check_run.completed")
    assert ci.route == "subscribers"
    # Without pass-through the same event waits for the router, which sees who handles it.
    off = Intake(pool, pass_through=False)
    routed = await _say(off, thread, "and multiplication")
    assert routed.route == "router"
    taken = await batches.take(pool)
    assert routed.trigger_id in taken.trigger_ids
    assert human.trigger_id not in taken.trigger_ids
    assert f"handled by {ticket_id}" in batches.render(taken)


async def test_the_router_forwards_an_event_to_a_ticket(
    pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    off = Intake(pool, pass_through=False)
    request = await _say(off, f"acme/calc#{new_id('thr')}", "@superagent fix calc")
    ticket_id = await _ticket_on(pool, request, None)
    thread = await pool.fetchval("SELECT external_id FROM threads WHERE id = $1", request.thread_id)
    event = await _say(off, thread, "@superagent also check subtraction")
    assert event.route == "router"

    def forward(req: ChatRequest) -> Reply:
        if req.tool_results():
            return Reply(content="Done.")
        calls = [
            ToolCall("forward", {"trigger": trigger, "ticket": ticket_id})
            for trigger in re.findall(r"\[(trg_\w+)\]", req.last_user_message() or "")
            if trigger == event.trigger_id
        ]
        return Reply(tool_calls=calls) if calls else Reply(content="nothing")

    fake_llm.respond_with(forward)
    router = Router(pool, fake_llm.async_openai_client(), FAKE_MODEL, policy=off.policy)
    await router.turn()
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM ticket_inbox WHERE ticket_id = $1 AND trigger_id = $2",
            ticket_id,
            event.trigger_id,
        )
        == 1
    )
    # Forwarding to a ticket that does not exist is refused, and said so to the model.
    refused = await router.tools.call(
        "forward", {"trigger": event.trigger_id, "ticket": "tkt_000000000000"}, _turn()
    )
    assert not refused.ok
    assert "no ticket" in refused.content["error"]


def _turn() -> Turn:
    return Turn(None, None, ())


async def test_the_single_session_baseline_runs_the_work_inside_its_tool_call(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    tmp_path: Path,
) -> None:
    off = Intake(pool, pass_through=False)
    request = await _say(off, f"acme/calc#{new_id('thr')}", "@superagent say hello")
    # The device is the requester's (work goes only to a device its requester may use).
    await pool.execute("UPDATE devices SET owner = 'github:u-1' WHERE id = $1", device.id)
    seen: list[str] = []

    def model(req: ChatRequest) -> Reply:
        if (req.system_prompt() or "").startswith("You are the router"):
            results = req.tool_results()
            if results:
                seen.append(str(results[-1]))
                return Reply(content="Done.")
            return Reply(
                tool_calls=[
                    ToolCall(
                        "subagent",
                        {
                            "title": "say hello",
                            "scope": "echo hello",
                            "threads": [],
                            "device": device.name,
                            "mandate_from": request.trigger_id,
                            "workdir": str(tmp_path),
                        },
                    )
                ]
            )
        if not req.tool_results():
            return Reply(tool_calls=[ToolCall("shell", {"command": "echo hello"})])
        return Reply(tool_calls=[ToolCall("report", {"status": "ready", "summary": "said hello"})])

    fake_llm.respond_with(model)
    client = fake_llm.async_openai_client(max_retries=0)
    settings = settings_for(fake_llm)
    router = Router(
        pool,
        client,
        FAKE_MODEL,
        policy=off.policy,
        subagent=Subagent(pool, queue, client, settings, owner="baseline"),
    )
    assert await router.turn() == 1
    ticket = await pool.fetchrow(
        "SELECT t.id, t.state FROM tickets t JOIN mandates m ON m.ticket_id = t.id "
        "WHERE m.trigger_id = $1",
        request.trigger_id,
    )
    assert ticket is not None
    assert ticket["state"] == "completed"
    assert len(seen) == 1
    assert "said hello" in seen[0]
    assert '"status": "ready"' in seen[0] or "'status': 'ready'" in seen[0]
    # The report went back through the tool call, not through the router's inbox.
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM triggers WHERE source = 'agent' AND actor_id = $1", ticket["id"]
        )
        == 0
    )
    assert (
        await pool.fetchval(
            "SELECT outcome FROM router_decisions WHERE tool = 'subagent' AND outcome LIKE $1",
            f"{ticket['id']}:%",
        )
        == f"{ticket['id']}: ready"
    )
