"""Every model call is priced by its own model, and a ticket's cost counts every call made
for it: the router turn that created it, its worker's calls, the watchdog's look at it.

Prices once lived under ``WORKERS__PRICES``: router calls were recorded at $0 and the
watchdog's (on the router's model) at the worker's rates, so the cost posted in a thread
was wrong whenever the two models differed.
"""

from __future__ import annotations

import logging
from decimal import Decimal

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.ingest.admission import Admission, SourceAdmission
from controlplane.ingest.intake import Intake
from controlplane.llm import Accounting, LlmClient
from controlplane.llm.prices import DEFAULTS, PriceBook, lookup
from controlplane.router.router import Router
from controlplane.settings import LlmPrices, LlmSettings
from controlplane.tickets import reports
from superagent_shared.ids import new_id
from tests.fakes.openai_server import FakeOpenAIServer, Reply
from tests.support.helpers import save_policy
from tests.support.router_harness import ALICE, QUICK_LLM, ask, tickets_for_batch

ROUTER_MODEL, WORKER_MODEL = "acme-router-1", "acme-worker-1"
PRICES = {
    ROUTER_MODEL: LlmPrices(input_usd_per_mtok=1, cached_usd_per_mtok=0.5, output_usd_per_mtok=2),
    WORKER_MODEL: LlmPrices(input_usd_per_mtok=10, cached_usd_per_mtok=1, output_usd_per_mtok=40),
}


def _dollars(model: str, prompt: int, cached: int, completion: int) -> Decimal:
    """The test's own arithmetic, from PRICES: not the code under test."""
    p = PRICES[model]
    total = (
        Decimal(str(p.input_usd_per_mtok)) * (prompt - cached)
        + Decimal(str(p.cached_usd_per_mtok)) * cached
        + Decimal(str(p.output_usd_per_mtok)) * completion
    )
    return (total / 1_000_000).quantize(Decimal("0.000001"))


def test_a_model_is_found_by_its_name_its_provider_prefix_or_its_dated_version() -> None:
    assert lookup(DEFAULTS, "gpt-4o") is DEFAULTS["gpt-4o"]
    assert lookup(DEFAULTS, "openai/gpt-4o-mini") is DEFAULTS["gpt-4o-mini"]
    assert lookup(DEFAULTS, "gpt-4o-2024-08-06") is DEFAULTS["gpt-4o"]
    assert lookup(DEFAULTS, "gpt-4o-mini-2024-07-18") is DEFAULTS["gpt-4o-mini"]  # the longest
    assert lookup(DEFAULTS, "claude-sonnet-4-20250514") is DEFAULTS["claude-sonnet-4"]
    assert lookup(DEFAULTS, "gpt-4oo") is None  # a dash, not any prefix
    assert lookup(DEFAULTS, "qwen2.5-coder-1.5b-instruct") is None


def test_the_operators_prices_win_and_an_unknown_model_costs_nothing_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    book = PriceBook({"gpt-4o": PRICES[WORKER_MODEL], **PRICES})
    assert book.for_model("gpt-4o-2024-08-06") == PRICES[WORKER_MODEL]
    assert book.cost(ROUTER_MODEL, 3_000, 1_000, 500) == Decimal("0.0035")  # 2k+0.5k+1k µ$
    caplog.set_level(logging.WARNING, logger="controlplane.llm.prices")
    assert book.cost("my-local-model", 10_000, 0, 10_000) == 0
    assert book.cost("my-local-model", 10_000, 0, 10_000) == 0
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1, warned
    assert "my-local-model" in warned[0]


@pytest.mark.pg
async def test_a_tickets_cost_is_its_router_and_worker_calls_each_at_its_models_prices(
    pool: asyncpg.Pool,
    db: async_sessionmaker[AsyncSession],
    fake_llm: FakeOpenAIServer,
) -> None:
    await save_policy(db, Admission(default=SourceAdmission(users=[ALICE.id])))
    intake = Intake(pool)
    await ask(intake, 1)
    llm = LlmSettings(**QUICK_LLM, prices=PRICES)
    # The router's turn: one call that files the ticket (and no second one: it is settled).
    fake_llm.script(lambda request: tickets_for_batch(request))
    router = Router(
        pool, fake_llm.async_openai_client(), ROUTER_MODEL, policy=intake.policy, llm=llm
    )
    assert await router.turn() == 1
    ticket_id = await pool.fetchval("SELECT id FROM tickets")
    # The worker's calls, as the worker makes them: on its session, for its ticket.
    worker = LlmClient(pool, fake_llm.async_openai_client(), llm)
    session_id = new_id("ses")
    await pool.execute(
        "INSERT INTO sessions (id, kind, ticket_id, model) VALUES ($1, 'worker', $2, $3)",
        session_id,
        ticket_id,
        WORKER_MODEL,
    )
    for _ in range(2):
        fake_llm.script(Reply(content="working", prompt_tokens=20_000, cached_tokens=15_000))
        await worker.complete(
            model=WORKER_MODEL,
            messages=[{"role": "user", "content": "go"}],
            accounting=Accounting(session_id, ticket_id=ticket_id),
        )

    calls = await pool.fetch(
        "SELECT model, prompt_tokens, cached_tokens, completion_tokens, cost_usd FROM llm_calls"
    )
    assert sorted(c["model"] for c in calls) == [ROUTER_MODEL, WORKER_MODEL, WORKER_MODEL]
    expected = Decimal(0)
    for c in calls:
        dollars = _dollars(
            c["model"], c["prompt_tokens"], c["cached_tokens"], c["completion_tokens"]
        )
        assert c["cost_usd"] == dollars, c  # each call at its own model's prices
        assert dollars > 0, c
        expected += dollars
    # The two models' rates differ tenfold: one price for both could not give this sum.
    spent = await reports.spent(pool, ticket_id)
    assert spent.cost_usd == expected
    tokens = sum(c["prompt_tokens"] + c["completion_tokens"] for c in calls)
    assert spent.tokens == tokens
    assert f"${expected:.4f}" in spent.line()
