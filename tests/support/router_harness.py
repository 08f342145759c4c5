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

from controlplane.ingest.admission import Actor
from controlplane.ingest.intake import IncomingTrigger, Ingested, Intake, ThreadRef
from controlplane.leadership import Leadership
from controlplane.router.router import Router
from controlplane.router.service import RouterService, TurnTaker
from controlplane.settings import Settings
from tests.fakes.openai_server import ChatRequest, Reply, ToolCall

ALICE = Actor("u-1", "alice")
TRIGGER = re.compile(r"\[(trg_\w+)\]")


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


def ignore_batch(request: ChatRequest, **reply: Any) -> Reply:
    """The model's answer that decides each trigger of the batch needs nothing (a turn must
    decide every event it holds); ``reply``: more of the answer (a delay, usage)."""
    return Reply(
        tool_calls=[
            ToolCall("ignore", {"trigger": trigger, "reason": "nothing to do"})
            for trigger in batch_of(request)
        ],
        **reply,
    )


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
