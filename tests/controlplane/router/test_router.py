"""Router turns against the fake OpenAI server: batching, tools, records, failures."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.db.urls import asyncpg_dsn
from controlplane.ingest.admission import Actor, Admission, SourceAdmission
from controlplane.ingest.intake import IncomingTrigger, Intake, ThreadRef
from controlplane.router.router import Router
from tests.fakes.openai_server import (
    FAKE_MODEL,
    ChatRequest,
    FakeOpenAIServer,
    Reply,
    ToolCall,
)
from tests.support.helpers import assert_eventually, save_policy
from tests.support.router_harness import (
    ALICE,
    ask,
    batch_of,
    ignore_batch,
    router_running,
    tickets_for_batch,
)

POLICY = Admission(default=SourceAdmission(users=[ALICE.id]))  # by actor id, never by name


@pytest.fixture
async def pool(pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession]) -> asyncpg.Pool:
    """The shared pool, with this module's policy saved."""
    await save_policy(db, POLICY)
    return pool


@pytest.fixture
def intake(pool: asyncpg.Pool) -> Intake:
    return Intake(pool)


@pytest.fixture
def router(pool: asyncpg.Pool, fake_llm: FakeOpenAIServer, intake: Intake) -> Router:
    return Router(pool, fake_llm.async_openai_client(), FAKE_MODEL, policy=intake.policy)


def _ticket_for_each(request: ChatRequest) -> Reply:
    if request.tool_results():
        return Reply(content="Done.")
    return tickets_for_batch(request)


async def test_a_turn_acts_on_its_batch_and_records_everything(
    router: Router, intake: Intake, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    asked = await ask(intake, 1)
    fake_llm.respond_with(_ticket_for_each)
    assert await router.turn() == 1
    assert await router.turn() == 0  # nothing left: no model call either
    requests = fake_llm.chat_requests
    # One call: the ticket was made, and there is nothing in the result to act on.
    assert len(requests) == 1
    assert "create_ticket" in requests[0].tool_names()
    mandate = await pool.fetchrow("SELECT ticket_id, trigger_id FROM mandates")
    assert mandate is not None
    assert mandate["trigger_id"] == asked.trigger_id
    assert await pool.fetchval("SELECT count(*) FROM triggers WHERE routed_at IS NULL") == 0
    calls = await pool.fetch("SELECT id, session_id, batch_size, policy_version_id FROM llm_calls")
    assert len(calls) == 1
    assert all(c["session_id"] == router.session_id and c["batch_size"] == 1 for c in calls)
    assert all(c["policy_version_id"] for c in calls)
    decision = await pool.fetchrow("SELECT llm_call_id, trigger_ids FROM router_decisions")
    assert decision is not None
    assert decision["llm_call_id"] in {c["id"] for c in calls}
    assert decision["trigger_ids"] == [asked.trigger_id]


async def test_events_arriving_during_a_slow_call_form_the_next_batch(
    router: Router, intake: Intake, fake_llm: FakeOpenAIServer
) -> None:
    first = await ask(intake, 1)
    slow = asyncio.Event()

    def respond(request: ChatRequest) -> Reply:
        if (request.last_message() or {}).get("role") != "user":
            return Reply(content="ok")
        if request.index == 0:
            slow.set()
            return ignore_batch(request, delay_ms=1500)
        return ignore_batch(request)

    fake_llm.respond_with(respond)
    turn = asyncio.create_task(router.turn())
    await asyncio.wait_for(slow.wait(), 10)
    later = [await ask(intake, n) for n in (2, 3, 4)]
    assert await turn == 1
    assert await router.turn() == 3
    batches = [batch_of(r) for r in fake_llm.chat_requests]
    assert batches == [[first.trigger_id], [e.trigger_id for e in later]]


async def test_a_failed_model_call_leaves_the_batch_queued(
    router: Router, intake: Intake, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    asked = await ask(intake, 1)
    fake_llm.script(Reply(error_status=500, should_retry=False))
    with pytest.raises(Exception, match="500"):
        await router.turn()
    assert await pool.fetchval("SELECT count(*) FROM triggers WHERE routed_at IS NULL") == 1
    error = await pool.fetchval("SELECT error FROM llm_calls")
    assert error
    fake_llm.respond_with(_ticket_for_each)
    assert await router.turn() == 1
    assert await pool.fetchval("SELECT trigger_id FROM mandates") == asked.trigger_id


async def test_the_prefix_stays_the_same_between_turns(
    router: Router, intake: Intake, fake_llm: FakeOpenAIServer
) -> None:
    fake_llm.respond_with(ignore_batch)
    for n in range(1, 4):
        await ask(intake, n)
        assert await router.turn() == 1
    first, second, third = fake_llm.chat_requests
    assert second.messages[: len(first.messages)] == first.messages
    assert third.messages[: len(second.messages)] == second.messages
    assert third.body["tools"] == first.body["tools"]


async def test_the_leader_routes_on_notification(
    router: Router,
    intake: Intake,
    pool: asyncpg.Pool,
    fake_llm: FakeOpenAIServer,
    database_url: str,
) -> None:
    fake_llm.respond_with(_ticket_for_each)
    async with router_running(router, pool, asyncpg_dsn(database_url)):
        await ask(intake, 1)

        async def ticketed() -> bool:
            return bool(await pool.fetchval("SELECT count(*) FROM tickets"))

        await assert_eventually(ticketed, timeout=10)


async def test_pass_through_causes_no_turn_but_the_next_turn_digests_it(
    router: Router, intake: Intake, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer
) -> None:
    fake_llm.respond_with(ignore_batch)
    opened = await ask(intake, 1)
    assert await router.turn() == 1
    ticket = "tkt_" + opened.trigger_id.removeprefix("trg_")
    await pool.execute("INSERT INTO tickets (id, title, state) VALUES ($1, 'x', 'running')", ticket)
    await pool.execute(
        "INSERT INTO subscriptions (thread_id, ticket_id) VALUES ($1, $2)", opened.thread_id, ticket
    )
    follow_up = await intake.ingest(
        IncomingTrigger(
            source="github",
            external_id="c-ci",
            thread=ThreadRef("acme/app#1"),
            actor=Actor("b-1", "ci[bot]", is_bot=True),
            kind="check_run",
            text="build failed: 3 tests",
        )
    )
    assert follow_up.tickets == (ticket,)
    assert await router.turn() == 0
    assert len(fake_llm.chat_requests) == 1  # no model call for it
    await ask(intake, 2)
    assert await router.turn() == 1
    digest = fake_llm.chat_requests[-1].last_user_message() or ""
    assert "Delivered to subscribed tickets" in digest
    assert follow_up.trigger_id in digest
    await ask(intake, 3)
    await router.turn()
    assert follow_up.trigger_id not in (fake_llm.chat_requests[-1].last_user_message() or "")


async def test_the_model_sees_what_it_must_act_on_and_nothing_more(
    router: Router, intake: Intake, fake_llm: FakeOpenAIServer
) -> None:
    asked = await ask(intake, 1)
    fake_llm.script(
        # A recall, and a refused call: both results go back to the model.
        Reply(
            tool_calls=[
                ToolCall("recall", {"id": asked.thread_id}),
                ToolCall("reply", {"thread": "thr_nope", "text": "hi"}),
            ]
        ),
        Reply(tool_calls=[ToolCall("reply", {"thread": asked.thread_id, "text": "Seen."})]),
    )
    assert await router.turn() == 1
    _, second = fake_llm.chat_requests
    results = [m["content"] for m in second.tool_results()]
    assert any(asked.trigger_id in r for r in results)  # the recalled thread's events
    assert any("must be a thr_ id" in r for r in results)
    fake_llm.assert_all_consumed()  # and no third call after the settling reply


async def test_a_new_leader_resumes_the_conversation_where_the_last_one_left_it(
    pool: asyncpg.Pool, intake: Intake, fake_llm: FakeOpenAIServer
) -> None:
    fake_llm.respond_with(ignore_batch)
    first = Router(pool, fake_llm.async_openai_client(), FAKE_MODEL, policy=intake.policy)
    for n in (1, 2):
        await ask(intake, n)
        assert await first.turn() == 1
    # The leader dies; another replica's router takes over the same session.
    second = Router(pool, fake_llm.async_openai_client(), FAKE_MODEL, policy=intake.policy)
    await ask(intake, 3)
    assert await second.turn() == 1
    assert second.session_id == first.session_id
    before, after = fake_llm.chat_requests[1], fake_llm.chat_requests[2]
    # Everything the last leader showed the model, and its answer, then the new batch.
    assert after.messages[: len(before.messages)] == before.messages
    answer = after.messages[len(before.messages)]
    assert answer["role"] == "assistant"
    assert [c["function"]["name"] for c in answer["tool_calls"]] == ["reply"]
    stored = await pool.fetchval(
        "SELECT count(*) FROM session_messages WHERE session_id = $1", first.session_id
    )
    assert stored == 9  # three turns: the batch, the answer and its result each
