"""The router's context is bounded by size, not only by turn count: big tool results are
cut, older turns summarised, a prompt the model refused as too long is compacted and tried
once more, and a new leader rebuilds exactly the context the last one had.

Real Postgres, the fake OpenAI server over HTTP, real router turns.
"""

from __future__ import annotations

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.ingest.admission import Admission, SourceAdmission
from controlplane.ingest.intake import Intake
from controlplane.llm.errors import ContextExceeded
from controlplane.llm.tokens import estimate_tokens
from controlplane.router.router import Router, TurnFailed
from controlplane.settings import LlmSettings
from tests.fakes.openai_server import (
    FAKE_MODEL,
    ChatRequest,
    FakeOpenAIServer,
    Reply,
    ToolCall,
    fault,
)
from tests.support.helpers import save_policy
from tests.support.router_harness import ALICE, ask, batch_of, ignore_batch

# A small window: the tools and the system prompt take about a quarter of the budget.
SMALL = LlmSettings(
    router_context_tokens=8192,
    compact_share=0.75,
    attempts=1,
    retry_base_seconds=0.01,
    timeout_seconds=5.0,
)
BUDGET = int(8192 * 0.75)
LONG = "@superagent " + " ".join(
    f"line {n}: the build log says the flaky test failed" for n in range(120)
)


@pytest.fixture
async def pool(pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession]) -> asyncpg.Pool:
    await save_policy(db, Admission(default=SourceAdmission(users=[ALICE.id])))
    return pool


@pytest.fixture
def intake(pool: asyncpg.Pool) -> Intake:
    return Intake(pool)


def _router(pool: asyncpg.Pool, fake_llm: FakeOpenAIServer, intake: Intake) -> Router:
    return Router(
        pool,
        fake_llm.async_openai_client(timeout=5.0),
        FAKE_MODEL,
        policy=intake.policy,
        llm=SMALL,
    )


def _recall_then_done(request: ChatRequest) -> Reply:
    """The model reads the whole of each new event (a big tool result), then decides it
    needs nothing."""
    last = request.last_message() or {}
    if last.get("role") == "user":
        return Reply(tool_calls=[ToolCall("recall", {"id": batch_of(request)[0]})])
    return ignore_batch(request)


def _sizes(request: ChatRequest, fake_llm: FakeOpenAIServer) -> tuple[int, int]:
    """The request's tokens by the router's estimate and by the fake's own count."""
    ours = estimate_tokens(request.messages, request.tools)
    theirs = fake_llm.estimate_tokens(fake_llm.prompt_text(request.messages, request.tools))
    return ours, theirs


async def test_a_long_run_with_big_tool_results_stays_within_the_budget(
    pool: asyncpg.Pool, intake: Intake, fake_llm: FakeOpenAIServer
) -> None:
    router = _router(pool, fake_llm, intake)
    fake_llm.respond_with(_recall_then_done)
    for n in range(1, 16):
        await ask(intake, n, LONG)
        assert await router.turn() == 1
    requests = fake_llm.chat_requests
    assert len(requests) == 30  # the recall, then reading its result, each turn
    for request in requests:
        ours, theirs = _sizes(request, fake_llm)
        assert ours <= BUDGET, f"request {request.index}: {ours} tokens"
        assert theirs <= BUDGET
    # The budget was reached: old results were cut, keeping the IDs to recall them by.
    everything = "\n".join(r.text() for r in requests)
    assert "characters cut; recall trg_" in everything
    assert "Earlier turns, compacted" in requests[-1].text()
    # Unbounded, the last request would have held every turn before it in full.
    assert sum(len(r.tool_results()) for r in requests[-1:]) < 14


async def test_a_prompt_too_long_for_the_model_is_compacted_and_tried_once_more(
    pool: asyncpg.Pool, intake: Intake, fake_llm: FakeOpenAIServer
) -> None:
    router = _router(pool, fake_llm, intake)
    fake_llm.respond_with(ignore_batch)
    for n in (1, 2, 3):
        await ask(intake, n)
        assert await router.turn() == 1
    fake_llm.script(fault("context_length"))
    asked = await ask(intake, 4)
    assert await router.turn() == 1
    refused, retried = fake_llm.chat_requests[-2:]
    assert batch_of(refused) == batch_of(retried) == [asked.trigger_id]
    assert len(retried.messages) < len(refused.messages)
    assert "Earlier turns, compacted" in retried.text()
    # Only the system prompt, the summary and this turn's batch are left.
    assert [m["role"] for m in retried.messages] == ["system", "user", "assistant", "user"]
    outcomes = [r["outcome"] for r in await pool.fetch("SELECT outcome FROM llm_calls")]
    assert sorted(outcomes[-2:]) == ["context", "ok"]
    routed = await pool.fetchval("SELECT routed_at FROM triggers WHERE id = $1", asked.trigger_id)
    assert routed is not None


async def test_a_prompt_too_long_even_compacted_fails_the_turn(
    pool: asyncpg.Pool, intake: Intake, fake_llm: FakeOpenAIServer
) -> None:
    router = _router(pool, fake_llm, intake)
    fake_llm.respond_with(ignore_batch)
    await ask(intake, 1)
    assert await router.turn() == 1
    fake_llm.script(fault("context_length"), fault("context_length"))
    asked = await ask(intake, 2)
    with pytest.raises(TurnFailed) as failed:
        await router.turn()
    assert isinstance(failed.value.cause, ContextExceeded)
    assert failed.value.trigger_ids == [asked.trigger_id]
    assert len(fake_llm.chat_requests) == 3  # one turn, then the refused call and one more


async def test_a_new_leader_rebuilds_the_compacted_context_the_last_one_had(
    pool: asyncpg.Pool, intake: Intake, fake_llm: FakeOpenAIServer
) -> None:
    fake_llm.respond_with(_recall_then_done)
    first = _router(pool, fake_llm, intake)
    for n in range(1, 14):
        await ask(intake, n, LONG)
        assert await first.turn() == 1
    assert first.conversation is not None
    assert first.conversation.reduced_through > 0  # the size bound compacted it
    # The leader dies; another replica's router takes over the same session.
    second = _router(pool, fake_llm, intake)
    rebuilt = await second._prepare()
    assert second.session_id == first.session_id
    assert rebuilt.marks == first.conversation.marks
    assert rebuilt.summary == first.conversation.summary
    assert rebuilt.messages([]) == first.conversation.messages([])
    # And the next call is the one the old leader would have made.
    asked = await ask(intake, 14, LONG)
    before = len(fake_llm.chat_requests)
    assert await second.turn() == 1
    sent = fake_llm.chat_requests[before]
    assert batch_of(sent) == [asked.trigger_id]
    assert sent.messages == first.conversation.fit([sent.messages[-1]], first.tool_specs)
