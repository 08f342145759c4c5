"""A real `superagent serve`, its router and its workers, through every fault a model can make.

The model (the fake OpenAI server) first answers with each fault class once, in turn (the
router meets them with the first requests), then with a random fault on 15 % of its calls,
for the router and the workers alike (the second wave of requests): garbage
bodies, no choices, null messages, 429/5xx, a context overflow, a bad key, an unknown
model, answers slower than the timeout, cut-off and invalid tool calls, and 300 identical
parallel calls. Two items are poison for good: one event the model can never decide, and
one ticket whose worker's model never answers sensibly.

Asserted, as an on-call engineer would want it: ``/healthz`` answers throughout and the
process never exits; every event ends routed or quarantined with a reason (the poison
request's thread told once that the agent could not act on it); every ticket ends in a
state whose reason ``superagent tickets show`` prints; attempts stay bounded; and nothing
is said twice.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import asyncpg
import httpx

from controlplane.db.urls import asyncpg_dsn
from controlplane.ingest.admission import Actor
from controlplane.ingest.intake import IncomingTrigger, Intake, ThreadRef
from controlplane.router.containment import GAVE_UP
from superagent_shared.ids import new_id
from tests.fakes.openai_server import (
    FAULTS,
    ChatRequest,
    FakeOpenAIServer,
    Reply,
    ToolCall,
    fault,
)
from tests.support.helpers import assert_eventually, free_port
from tests.support.replica_process import ReplicaProcess, prepare_database, serve_env

ALICE = Actor("alice", "alice", groups=("console",))
GOOD = 8  # ordinary requests
LIMIT = 3  # router.quarantine_after and workers.failed_rounds_limit
_THREAD = re.compile(r"^thread (thr_\w+) ")
_EVENT = re.compile(r"^\s+\[(trg_\w+)\] \S+ (\S+) from .*?Z: (.*)$")


def _router(request: ChatRequest) -> Reply:
    """A ticket for each request, a reply for each report; the POISON event, never."""
    last_user = max(
        (i for i, m in enumerate(request.messages) if m.get("role") == "user"), default=0
    )
    results = [
        str(m.get("content")) for m in request.messages[last_user + 1 :] if m["role"] == "tool"
    ]
    if any('"ticket"' in r or '"queued"' in r for r in results):
        return Reply(content="Done.")  # decided; calls the fault broke were tried again
    batch = request.last_user_message() or ""
    if "POISON" in batch:
        return fault("empty_choices")  # type: ignore[return-value]
    calls, thread = [], None
    for line in batch.splitlines():
        if found := _THREAD.match(line):
            thread = found.group(1)
        elif event := _EVENT.match(line):
            trigger, kind, text = event.groups()
            if kind.startswith("report."):
                calls.append(ToolCall("reply", {"thread": thread, "text": f"{trigger}: {kind}"}))
            else:
                title = "DOOMED work" if "DOOMED" in text else f"fix {trigger}"
                calls.append(
                    ToolCall(
                        "create_ticket",
                        {
                            "title": title,
                            "scope": "as asked",
                            "threads": [],
                            "device": None,
                            "mandate_from": trigger,
                        },
                    )
                )
    return Reply(tool_calls=calls) if calls else Reply(content="Nothing to decide.")


def _worker(request: ChatRequest) -> Reply:
    """A question back to the requester; for the DOOMED ticket, garbage every time."""
    brief = next((m for m in request.messages if m.get("role") == "user"), {})
    if "DOOMED" in str(brief.get("content")):
        return fault("null_message")  # type: ignore[return-value]
    call = ToolCall(
        "report", {"status": "question", "summary": "looked", "question": "which branch?"}
    )
    return Reply(tool_calls=[call])


def _model(request: ChatRequest) -> Reply:
    return _worker(request) if "report" in request.tool_names() else _router(request)


async def _ask(intake: Intake, text: str) -> str:
    ingested = await intake.ingest(
        IncomingTrigger(
            source="web",
            external_id=new_id("msg"),
            thread=ThreadRef(new_id("thr")),
            actor=ALICE,
            kind="message",
            text=f"@superagent {text}",
            direct=True,
        )
    )
    return ingested.trigger_id


async def _health(url: str, misses: list[str], stop: asyncio.Event) -> None:
    async with httpx.AsyncClient(timeout=2.0) as client:
        while not stop.is_set():
            try:
                answer = await client.get(f"{url}/healthz")
                if answer.status_code != 200:
                    misses.append(f"{answer.status_code}")
            except httpx.HTTPError as exc:
                misses.append(repr(exc))
            await asyncio.sleep(0.2)


async def test_serve_contains_every_model_fault_for_router_and_workers(
    empty_database: str, fake_llm: FakeOpenAIServer, tmp_path: Path
) -> None:
    await prepare_database(empty_database, [ALICE.id])
    fake_llm.script(*(fault(kind) for kind in sorted(FAULTS)))
    fake_llm.inject_faults(0.15, seed=5)
    fake_llm.respond_with(_model)
    port = free_port()
    env = serve_env(
        empty_database,
        fake_llm.url,
        tmp_path / "state",
        port,
        SUPERAGENT_LLM__TIMEOUT_SECONDS="1",
        SUPERAGENT_ROUTER__QUARANTINE_AFTER=str(LIMIT),
        SUPERAGENT_ROUTER__RETRY_CAP_SECONDS="4",
        SUPERAGENT_WORKERS__FAILED_ROUNDS_LIMIT=str(LIMIT),
        SUPERAGENT_WORKERS__RETRY_BASE_SECONDS="0.2",
        SUPERAGENT_WORKERS__LEASE_SECONDS="4",
        SUPERAGENT_WORKERS__RENEW_SECONDS="1",
        SUPERAGENT_WATCHDOG__ADMIN_THREAD="web:admin",
    )
    replica = ReplicaProcess(env, tmp_path / "serve.log", port)
    replica.start()
    pool = await asyncpg.create_pool(asyncpg_dsn(empty_database), min_size=1, max_size=2)
    assert pool is not None
    misses: list[str] = []
    stop = asyncio.Event()
    health: asyncio.Task[None] | None = None
    try:
        await assert_eventually(replica.up, timeout=60, message=f"serve is up ({replica.log})")
        health = asyncio.create_task(_health(replica.url, misses, stop))
        intake = Intake(pool)
        # The first wave meets the scripted faults, one of each, back to back.
        first = [await _ask(intake, f"fix the flaky test number {n}") for n in range(GOOD)]
        poison = await _ask(intake, "POISON: nobody can decide this")

        async def routed(ids: list[str]) -> bool:
            assert replica.alive(), f"serve exited (see {replica.log})"
            waiting = await pool.fetchval(
                "SELECT count(*) FROM triggers WHERE id = ANY($1::text[]) AND routed_at IS NULL",
                ids,
            )
            return bool(waiting == 0)

        await assert_eventually(
            lambda: routed([*first, poison]), timeout=120, message=f"wave 1 ({replica.log})"
        )
        assert fake_llm.pending_replies == 0  # every scripted fault was met
        # The second wave, under random faults only, with the doomed ticket.
        second = [await _ask(intake, f"fix the slow test number {n}") for n in range(GOOD)]
        doomed = await _ask(intake, "DOOMED: this work can never succeed")
        asked = [*first, poison, *second, doomed]

        async def settled() -> bool:
            assert replica.alive(), f"serve exited (see {replica.log})"
            open_triggers = await pool.fetchval(
                "SELECT count(*) FROM triggers WHERE routed_at IS NULL"
            )
            live = await pool.fetchval(
                "SELECT count(*) FROM tickets WHERE state IN ('open', 'running')"
            )
            return bool(open_triggers == 0 and live == 0)

        await assert_eventually(settled, timeout=150, message=f"all settled ({replica.log})")
        # Settled means settled: a few more seconds change nothing.
        calls = len(fake_llm.chat_requests)
        await asyncio.sleep(3)
        assert await settled()
        stop.set()
        await health
        assert len(fake_llm.chat_requests) == calls, "the model is still being called"

        # Every event ends routed, or quarantined with a reason: the poison one for sure,
        # and those the scripted faults hit too often; the rest are decided.
        undecidable = {
            row["id"]: row["route_error"]
            for row in await pool.fetch(
                "SELECT id, route_error FROM triggers WHERE undecidable_at IS NOT NULL"
            )
        }
        assert "malformed" in undecidable.pop(poison)
        assert all(undecidable.values()), undecidable  # each with its reason
        assert doomed not in undecidable
        assert len(undecidable) <= GOOD // 2, undecidable
        decided = {
            row["trigger_id"]
            for row in await pool.fetch(
                "SELECT trigger_id FROM mandates WHERE trigger_id = ANY($1::text[])", asked
            )
        }
        assert decided == set(asked) - {poison} - set(undecidable)

        # Every ticket ends in a state whose reason `tickets show` prints.
        for row in await pool.fetch("SELECT id, title, state, hold FROM tickets"):
            shown = (
                await asyncio.to_thread(
                    subprocess.run,
                    [sys.executable, "-m", "controlplane.cli", "tickets", "show", row["id"]],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=True,
                )
            ).stdout
            if row["title"].startswith("DOOMED"):
                assert (row["state"], row["hold"]) == ("waiting_human", "blocked")
                assert "state:    waiting_human (blocked)" in shown
                assert "failed:   malformed" in shown
                assert f"{LIMIT} rounds in a row failed" in shown
            else:
                assert (row["state"], row["hold"]) == ("waiting_human", "question"), shown
                assert "question: " in shown or "which branch?" in shown

        # Attempts stay bounded.
        assert await pool.fetchval("SELECT max(route_attempts) FROM triggers") <= LIMIT
        assert await pool.fetchval("SELECT max(failed_rounds) FROM tickets") < LIMIT
        rounds = await pool.fetchval(
            "SELECT max(n) FROM (SELECT count(*) AS n FROM assignments GROUP BY ticket_id) c"
        )
        assert rounds <= LIMIT + 3  # the doomed ticket's rounds, plus a few for lost leases
        assert calls < 60 * (GOOD + 2)

        # Nothing is said twice: each text once per thread, sent or still queued.
        said = await pool.fetch(
            "SELECT thread_id, text FROM sent_messages UNION ALL "
            "SELECT payload->>'thread_id', payload->>'text' FROM effects WHERE kind = 'reply'"
        )
        texts = [(row["thread_id"], row["text"]) for row in said]
        assert len(texts) == len(set(texts)), texts
        poison_thread = await pool.fetchval("SELECT thread_id FROM triggers WHERE id = $1", poison)
        # Its requester is told once, in one line, that the agent could not act on it.
        assert [text for thread, text in texts if thread == poison_thread] == [GAVE_UP]
        outcomes = {row["outcome"] for row in await pool.fetch("SELECT outcome FROM llm_calls")}
        assert {"ok", "malformed", "transient", "permanent", "context"} <= outcomes
    finally:
        stop.set()
        if health is not None and not health.done():
            await health
        await pool.close()
        replica.stop()
    assert replica.kills == 0
    assert misses == [], misses[:5]
