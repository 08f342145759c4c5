"""The overview is honest: it never says "All is well" while model calls fail or requests
from allowlisted people wait unanswered (issue 32: it did, with 10 of 35 model calls failed
and 3 requests unanswered). A real replica in real headless Chromium, and the same app in
process for the numbers behind the page.
"""

from __future__ import annotations

import json

import asyncpg
from playwright.async_api import expect

from controlplane.ingest.admission import Actor
from controlplane.ingest.intake import IncomingTrigger, Intake, ThreadRef
from controlplane.router.tools import toolbox
from superagent_shared.ids import new_id
from tests.support.console_browser import chromium, screenshot
from tests.support.console_replica import (  # noqa: F401 - the replica fixture
    Replica,
    in_process,
    replica_fixture,
    sign_in,
    up,
)


async def _calls(pool: asyncpg.Pool, outcome: str, count: int, error: str | None) -> None:
    for _ in range(count):
        await pool.execute(
            "INSERT INTO llm_calls (id, model, prompt_tokens, completion_tokens, cached_tokens, "
            "latency_ms, batch_size, cost_usd, outcome, error) "
            "VALUES ($1, 'qwen2.5-coder-1.5b', 2200, 40, 2000, 20000, 1, 0, $2, $3)",
            new_id("llm"),
            outcome,
            error,
        )


async def test_the_overview_does_not_say_all_is_well_while_model_calls_fail(
    replica: Replica, pool: asyncpg.Pool
) -> None:
    url = await up(replica)
    await _calls(pool, "ok", 25, None)
    await _calls(pool, "transient", 6, "transient: no answer within 120s")
    await _calls(pool, "malformed", 4, "malformed: the answer has no choices")
    async with chromium() as browser:
        page = await browser.new_page()
        await sign_in(page, url, "/console")
        main = page.locator("#view")
        await expect(main).to_contain_text("Failing model calls (10 of 35 in the last 24 hours)")
        await expect(main).to_contain_text("no answer within 120s")
        await expect(main).to_contain_text("the answer has no choices")
        await expect(main).not_to_contain_text("All is well")
        await screenshot(page, "overview-failing-calls")


async def _request(intake: Intake, n: int) -> str:
    asked = await intake.ingest(
        IncomingTrigger(
            source="web",
            external_id=f"m-{n}",
            thread=ThreadRef(f"t-{n}"),
            actor=Actor("alice", "alice", groups=("console",)),
            kind="message",
            text=f"@superagent add a CONTRIBUTORS file ({n})",
            direct=True,
        )
    )
    assert asked.verdict == "explicit"
    return asked.trigger_id


async def test_the_overview_counts_requests_the_router_has_not_acted_on(
    pool: asyncpg.Pool,
) -> None:
    intake = Intake(pool)
    failing, waiting, fresh = [await _request(intake, n) for n in (1, 2, 3)]
    await pool.execute(
        "UPDATE triggers SET route_attempts = 2, route_error = $2 WHERE id = $1",
        failing,
        "malformed: the turn ended without deciding it (the same ignore call 3 times in a row)",
    )
    await pool.execute(
        "UPDATE triggers SET created_at = now() - interval '20 minutes' WHERE id = $1", waiting
    )
    async with in_process(pool, bearer=True) as client:
        shown = (await client.get("/console/api/overview")).json()
    assert shown["quiet"] is False
    unanswered = {r["id"]: r for r in shown["attention"]["unanswered"]}
    assert set(unanswered) == {failing, waiting}  # one just asked is not yet unanswered
    assert fresh not in unanswered
    assert unanswered[failing]["state"] == "failing (2 failed turns)"
    assert "same ignore call" in unanswered[failing]["route_error"]
    assert unanswered[waiting]["state"] == "waiting for the router"


async def test_the_trigger_feed_shows_the_routers_decision_and_refused_calls(
    replica: Replica, pool: asyncpg.Pool
) -> None:
    url = await up(replica)
    trigger_id = await _request(Intake(pool), 1)
    # As the router's toolbox records a turn: two refused calls, then the one that decided.
    for tool, arguments, outcome, ok in (
        ("ignore", {"trigger": "thr_0000000000ab"}, "refused: must be a trg_ id", False),
        ("create_ticket", {"mandate_from": "admin"}, "refused: no trigger admin", False),
        ("ignore", {"trigger": trigger_id}, "ignored: just thanks", True),
    ):
        await toolbox.record(pool, tool, json.dumps(arguments), [trigger_id], outcome, ok)
    async with chromium() as browser:
        page = await browser.new_page()
        await sign_in(page, url, "/console/triggers")
        row = page.locator("tr", has_text="add a CONTRIBUTORS file (1)")
        await expect(row).to_contain_text("ignore: ignored: just thanks")
        await expect(row).to_contain_text("refused")
        await row.locator("summary").click()
        # The replica's own rules-only router may add its calls; these three are there.
        refused = row.locator("li", has_text="refused")
        await expect(refused.filter(has_text="no trigger admin")).to_contain_text("create_ticket")
        await expect(refused.filter(has_text="must be a trg_ id")).to_contain_text("ignore")
        await expect(row.locator("li", has_text="ignored: just thanks")).to_be_visible()
        await screenshot(page, "triggers-router-calls")
