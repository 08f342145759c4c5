"""Pieces for router tests: alice's requests on GitHub, the model deciding a ticket for
each of them (or that each needs nothing), and the router service running under its own
leadership."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.db.urls import asyncpg_dsn
from controlplane.domain import EffectKind
from controlplane.ingest.admission import Actor, Admission, SourceAdmission
from controlplane.ingest.intake import IncomingTrigger, Ingested, Intake, ThreadRef
from controlplane.leadership import Leadership
from controlplane.router.router import Router
from controlplane.router.service import RouterService, TurnTaker
from controlplane.settings import LlmSettings, Settings
from tests.fakes.openai_server import FAKE_MODEL, ChatRequest, FakeOpenAIServer, Reply, ToolCall
from tests.support.helpers import save_policy

ALICE = Actor("u-1", "alice")
# One try and a short timeout: a router test sees each failure in seconds.
QUICK_LLM = {
    "attempts": 1,
    "retry_base_seconds": 0.01,
    "retry_cap_seconds": 0.05,
    "timeout_seconds": 2.0,
}
TRIGGER = re.compile(r"\[(trg_\w+)\]")
EVENT = re.compile(r"\s+\[(?P<trigger>trg_\w+)\] (?P<verdict>\w+) ")


async def ask(intake: Intake, n: int, text: str = "@superagent fix the flaky test") -> Ingested:
    """alice comments ``text`` on issue ``n`` of acme/app."""
    return await intake.ingest(
        IncomingTrigger(
            source="github",
            external_id=f"c-{n}",
            thread=ThreadRef(f"acme/app#{n}", title=f"issue {n}"),
            actor=ALICE,
            kind="issue_comment",
            text=text,
        )
    )


def batch_of(request: ChatRequest) -> list[str]:
    """The trigger ids of the batch this request shows (its last user message)."""
    return TRIGGER.findall(request.last_user_message() or "")


def tickets_for_batch(request: ChatRequest) -> Reply:
    """The model's answer that files a ticket for each trigger of the batch."""
    return Reply(
        tool_calls=[
            ToolCall(
                "create_ticket",
                {
                    "title": "fix it",
                    "scope": "as asked",
                    "threads": [],
                    "device": None,
                    "mandate_from": trigger,
                },
            )
            for trigger in batch_of(request)
        ]
    )


def events_of(request: ChatRequest) -> list[tuple[str, str, str]]:
    """(trigger, its thread, its verdict) for each event of the batch the request shows."""
    found, thread = [], ""
    for line in (request.last_user_message() or "").splitlines():
        if line.startswith("thread "):
            thread = line.split()[1]
        elif (event := EVENT.match(line)) is not None:
            found.append((event["trigger"], thread, event["verdict"]))
    return found


def ignore_batch(request: ChatRequest, **reply: Any) -> Reply:
    """The model's answer that decides each trigger of the batch needs nothing (a turn must
    decide every event it holds): an explicit request or a worker's report is answered on
    its thread (a person who asked hears back; ``ignore`` refuses both), anything else
    ignored. ``reply``: more of the answer (a delay, usage)."""
    calls, answered = [], set()
    for trigger, thread, verdict in events_of(request):
        if verdict not in ("explicit", "report"):
            calls.append(ToolCall("ignore", {"trigger": trigger, "reason": "nothing to do"}))
        elif thread not in answered:  # one reply decides every event on its thread
            answered.add(thread)
            calls.append(ToolCall("reply", {"thread": thread, "text": "Nothing to do here."}))
    return Reply(tool_calls=calls, **reply)


@contextlib.asynccontextmanager
async def router_running(
    router: Router | TurnTaker,
    pool: asyncpg.Pool,
    dsn: str,
    *,
    settings: Settings | None = None,
    retry_base: float | None = None,
) -> AsyncIterator[RouterService]:
    """``router`` under a running ``RouterService``, once its leadership is gained.

    ``settings`` give the service its quarantine and notice settings (the defaults
    otherwise); ``retry_base`` shortens the backoff between failed turns (to at most 16
    times itself)."""
    leadership = Leadership(pool, "me", lease_seconds=10, renew_seconds=1)
    if settings is None and retry_base is None:
        service = RouterService(router, leadership, dsn, pool)
    else:
        service = RouterService(
            router,
            leadership,
            dsn,
            pool,
            settings=settings,
            retry_base=retry_base or 1.0,
            max_backoff=(retry_base or 1.0) * 16,
        )
    await leadership.start()
    await service.start()
    try:
        await asyncio.wait_for(leadership.gained.wait(), 10)
        yield service
    finally:
        await service.stop()
        await leadership.stop()


# Fixtures for a module's router tests (import them by these names): alice admitted, her
# intake, a router over the fake model with quick tries, the database's DSN.
@pytest.fixture(name="pool")
async def admitted_pool_fixture(
    pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession]
) -> asyncpg.Pool:
    await save_policy(db, Admission(default=SourceAdmission(users=[ALICE.id])))
    return pool


@pytest.fixture(name="intake")
def intake_fixture(pool: asyncpg.Pool) -> Intake:
    return Intake(pool)


@pytest.fixture(name="router")
def router_fixture(pool: asyncpg.Pool, fake_llm: FakeOpenAIServer, intake: Intake) -> Router:
    return Router(
        pool,
        fake_llm.async_openai_client(timeout=2.0),
        FAKE_MODEL,
        policy=intake.policy,
        llm=LlmSettings(**QUICK_LLM),
    )


@pytest.fixture(name="dsn")
def dsn_fixture(database_url: str) -> str:
    return asyncpg_dsn(database_url)


def fresh(request: ChatRequest) -> bool:
    """The request shows a new batch (not the results of this turn's tool calls, nor the
    router's reminder of what it left undecided)."""
    last = request.last_message() or {}
    return last.get("role") == "user" and " new event(s)." in str(last.get("content"))[:40]


async def replies_to(pool: asyncpg.Pool, thread_id: str) -> list[str]:
    """The replies queued for ``thread_id``, oldest first."""
    rows = await pool.fetch(
        "SELECT payload->>'text' AS text FROM effects WHERE kind = $1 "
        "AND payload->>'thread_id' = $2 ORDER BY created_at",
        EffectKind.REPLY,
        thread_id,
    )
    return [row["text"] for row in rows]


async def admin_alerts(pool: asyncpg.Pool) -> list[str]:
    """What the admin's web thread was told, oldest first."""
    rows = await pool.fetch(
        "SELECT e.payload->>'text' AS text FROM effects e JOIN threads t "
        "ON t.id = e.payload->>'thread_id' WHERE e.kind = $1 AND t.source = 'web' "
        "AND t.external_id = 'admin' ORDER BY e.created_at",
        EffectKind.REPLY,
    )
    return [row["text"] for row in rows]
