"""``GET /metrics``: the deployment's numbers, read from the real database at each scrape."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.api.app import create_app
from controlplane.db.models import (
    Command,
    Device,
    Effect,
    InboxItem,
    LlmCall,
    RouterDecision,
    Session,
    Thread,
    Ticket,
    Trigger,
)
from controlplane.db.urls import asyncpg_dsn
from controlplane.metrics import SCRAPE_TIMEOUT
from controlplane.settings import Settings
from controlplane.web.state import AppState
from tests.support.database import transaction, unreachable_pool

Key = tuple[str, frozenset[tuple[str, str]]]
Samples = dict[Key, float]


TOKEN = "metrics-token-canary-1234-5678-90ab-cdef"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def client_for(
    pool: asyncpg.Pool,
    *,
    client: tuple[str, int] = ("127.0.0.1", 5000),
    headers: dict[str, str] | None = None,
    **settings: object,
) -> httpx.AsyncClient:
    """An in-process app whose admin token is TOKEN; the client sends it unless told."""
    settings.setdefault("admin_token", TOKEN)
    state = AppState(settings=Settings(**settings), pool=pool, replica_id="test-replica")  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=create_app(state), client=client)
    return httpx.AsyncClient(
        transport=transport,
        base_url="http://127.0.0.1",
        headers=BEARER if headers is None else headers,
    )


async def scrape(client: httpx.AsyncClient, **headers: str) -> Samples:
    response = await client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = list(text_string_to_metric_families(response.text))
    for family in families:
        assert family.name.startswith("superagent_"), family.name
        assert family.documentation, f"{family.name} has no HELP text"
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in families
        for sample in family.samples
    }


def key(name: str, **labels: str) -> Key:
    return name, frozenset(labels.items())


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    """How much a sample grew; it must be in the later scrape."""
    return after[key(name, **labels)] - before.get(key(name, **labels), 0.0)


async def add_rows(db: async_sessionmaker[AsyncSession]) -> None:
    now = datetime.now(UTC)
    async with transaction(db) as session:
        thread = Thread(source="web", external_id="metrics-thread")
        ticket = Ticket(title="count me", state="waiting_device")
        online = Device(name="metrics-online", connected_replica="r1", last_seen_at=now)
        gone = Device(
            name="metrics-gone", connected_replica="r1", last_seen_at=now - timedelta(hours=1)
        )
        revoked = Device(name="metrics-revoked", revoked_at=now)
        router = Session(kind="router", model="m-router")
        worker = Session(kind="worker", model="m-worker")
        session.add_all([thread, ticket, online, gone, revoked, router, worker])
        await session.flush()
        waiting = [
            Trigger(
                source="web",
                external_id=f"metrics-{n}",
                thread_id=thread.id,
                actor_id="web:alice",
                actor_name="alice",
                kind="message",
                routed_at=now if n == 0 else None,
            )
            for n in range(3)
        ]
        session.add_all(waiting)
        await session.flush()
        session.add(InboxItem(ticket_id=ticket.id, trigger_id=waiting[0].id))
        session.add_all(
            Command(
                device_id=online.id,
                seq=seq,
                kind="exec",
                spec={},
                state=state,
                not_after=now + timedelta(hours=1),
            )
            for seq, state in enumerate(("queued", "queued", "awaiting_approval", "finished"), 1)
        )
        later = now + timedelta(minutes=5)
        session.add_all(
            [
                Effect(
                    kind="m", key="ready", payload={}, next_attempt_at=now - timedelta(seconds=1)
                ),
                Effect(
                    kind="m",
                    key="running",
                    payload={},
                    attempts=3,
                    locked_by="r1",
                    next_attempt_at=later,
                ),
                Effect(kind="m", key="backoff", payload={}, attempts=2, next_attempt_at=later),
                Effect(kind="m", key="dead", payload={}, attempts=20, dead_at=now),
            ]
        )
        session.add_all(
            RouterDecision(tool=tool, arguments={}, outcome="", ok=ok)
            for tool, ok in (("reply", True), ("reply", True), ("create_ticket", False))
        )
        session.add_all(
            [
                LlmCall(
                    session_id=router.id,
                    model="m-router",
                    prompt_tokens=100,
                    completion_tokens=10,
                    cached_tokens=64,
                    latency_ms=100,
                ),
                LlmCall(
                    session_id=router.id,
                    model="m-router",
                    prompt_tokens=50,
                    completion_tokens=5,
                    cached_tokens=0,
                    latency_ms=700,
                ),
                LlmCall(
                    session_id=router.id,
                    model="m-router",
                    latency_ms=3000,
                    error="timeout",
                    outcome="transient",
                ),
                LlmCall(
                    session_id=worker.id,
                    model="m-worker",
                    prompt_tokens=7,
                    completion_tokens=3,
                    latency_ms=40000,
                ),
            ]
        )


async def test_a_scrape_reads_what_the_database_holds(
    pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession]
) -> None:
    async with client_for(pool) as client:
        before = await scrape(client)
        await add_rows(db)
        after = await scrape(client)

    def grew(name: str, **labels: str) -> float:
        return delta(before, after, name, **labels)

    assert grew("superagent_router_inbox") == 2
    assert grew("superagent_ticket_inbox_unread") == 1
    assert grew("superagent_commands", state="queued") == 2
    assert grew("superagent_commands", state="awaiting_approval") == 1
    assert grew("superagent_commands", state="running") == 0
    assert key("superagent_commands", state="finished") not in after
    assert grew("superagent_tickets", state="waiting_device") == 1
    assert grew("superagent_tickets", state="completed") == 0

    assert grew("superagent_effects", state="ready") == 1
    assert grew("superagent_effects", state="running") == 1
    assert grew("superagent_effects", state="backoff") == 1
    assert grew("superagent_effects", state="dead") == 1
    assert grew("superagent_effect_retries") == 3  # 2 + 1: dead ones no longer retry

    assert grew("superagent_router_decisions_total", tool="reply", ok="true") == 2
    assert grew("superagent_router_decisions_total", tool="create_ticket", ok="false") == 1

    router = {"kind": "router", "model": "m-router"}
    assert grew("superagent_llm_calls_total", **router) == 3
    assert grew("superagent_llm_errors_total", **router) == 1
    assert grew("superagent_llm_outcomes_total", **router, outcome="ok") == 2
    assert grew("superagent_llm_outcomes_total", **router, outcome="transient") == 1
    assert grew("superagent_llm_tokens_total", **router, type="prompt") == 150
    assert grew("superagent_llm_tokens_total", **router, type="completion") == 15
    assert grew("superagent_llm_tokens_total", **router, type="cached") == 64
    assert grew("superagent_llm_latency_seconds_bucket", **router, le="0.25") == 1
    assert grew("superagent_llm_latency_seconds_bucket", **router, le="1.0") == 2
    assert grew("superagent_llm_latency_seconds_bucket", **router, le="2.5") == 2
    assert grew("superagent_llm_latency_seconds_bucket", **router, le="5.0") == 3
    assert grew("superagent_llm_latency_seconds_bucket", **router, le="+Inf") == 3
    assert grew("superagent_llm_latency_seconds_count", **router) == 3
    assert abs(grew("superagent_llm_latency_seconds_sum", **router) - 3.8) < 1e-9
    worker = {"kind": "worker", "model": "m-worker"}
    assert grew("superagent_llm_calls_total", **worker) == 1
    assert grew("superagent_llm_latency_seconds_bucket", **worker, le="30.0") == 0
    assert grew("superagent_llm_latency_seconds_bucket", **worker, le="60.0") == 1

    assert grew("superagent_devices_online") == 1
    assert grew("superagent_devices_paired") == 2  # the revoked one is not paired any more

    for group in ("queues", "effects", "decisions", "llm", "devices"):
        assert after[key("superagent_scrape_up", group=group)] == 1
        assert grew("superagent_scrape_errors_total", group=group) == 0


async def test_a_slow_table_leaves_out_its_metrics_not_the_scrape(
    pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    blocker = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        async with client_for(pool) as client:
            before = await scrape(client)
            # An exclusive lock makes every read of the outbox wait, as a database stuck on
            # that table would.
            transaction_ = blocker.transaction()
            await transaction_.start()
            await blocker.execute("LOCK TABLE effects IN ACCESS EXCLUSIVE MODE")
            started = time.monotonic()
            during = await scrape(client)
            took = time.monotonic() - started
            await transaction_.rollback()
            after = await scrape(client)
    finally:
        await blocker.close()

    assert took < SCRAPE_TIMEOUT + 2
    assert during[key("superagent_scrape_up", group="effects")] == 0
    assert delta(before, during, "superagent_scrape_errors_total", group="effects") == 1
    assert not any(name == "superagent_effects" for name, _ in during)
    # The other groups answered as usual.
    assert during[key("superagent_scrape_up", group="queues")] == 1
    assert key("superagent_router_inbox") in during
    assert key("superagent_devices_paired") in during
    # Once the table is free again, so are its metrics.
    assert after[key("superagent_scrape_up", group="effects")] == 1
    assert key("superagent_effects", state="dead") in after


async def test_without_an_admin_token_nobody_may_scrape_loopback_included(
    pool: asyncpg.Pool,
) -> None:
    for address in ("127.0.0.1", "::1", "10.1.2.3"):
        async with client_for(pool, client=(address, 5000), headers={}, admin_token=None) as client:
            refused = await client.get("/metrics")
        assert refused.status_code == 401
        error = refused.json()["error"]
        assert error["code"] == "unauthorized"
        assert "SUPERAGENT_ADMIN_TOKEN" in error["message"]


async def test_with_an_admin_token_the_scrape_needs_it(pool: asyncpg.Pool) -> None:
    token = TOKEN
    async with client_for(pool, client=("10.1.2.3", 5000), headers={}) as client:
        missing = await client.get("/metrics")
        wrong = await client.get("/metrics", headers={"Authorization": "Bearer nope"})
        basic = await client.get("/metrics", headers={"Authorization": f"Basic {token}"})
        samples = await scrape(client, Authorization=f"Bearer {token}")
    for refused in (missing, wrong, basic):
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "unauthorized"
        assert "Authorization: Bearer" in refused.json()["error"]["message"]
        assert token not in refused.text
    assert key("superagent_scrape_up", group="queues") in samples
    # Loopback is no exception.
    async with client_for(pool, headers={}) as local:
        assert (await local.get("/metrics")).status_code == 401


async def test_an_unreachable_database_still_gets_an_answer() -> None:
    dead = await unreachable_pool()
    try:
        async with client_for(dead) as client:
            samples = await scrape(client)
    finally:
        await dead.close()
    for group in ("queues", "effects", "decisions", "llm", "devices"):
        assert samples[key("superagent_scrape_up", group=group)] == 0
        assert samples[key("superagent_scrape_errors_total", group=group)] == 1
    assert not any(name == "superagent_router_inbox" for name, _ in samples)
