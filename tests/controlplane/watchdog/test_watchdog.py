"""The watchdog: what it notices in recorded state, and the ladder of what it does.

Each test builds the state on a real Postgres (a running round that stalled, a loop, a
failing model, a silent replica, a dead queue), runs passes with ``check_once`` (the same
pass the process runs on its timer), and checks the findings, the actions on record and
their effects on tickets, sessions and the admin channel.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from controlplane.domain import EffectKind
from controlplane.ingest.admission import Actor
from controlplane.ingest.intake import IncomingTrigger, Intake, ThreadRef
from controlplane.llm.prices import PriceBook
from controlplane.router.router import Router
from controlplane.router.rules_only import RulesOnlyRouter
from controlplane.settings import Settings, WatchdogSettings
from controlplane.tickets import explain, reports, slots
from controlplane.watchdog.service import Watchdog
from superagent_shared.ids import new_id
from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer, Reply, ToolCall
from tests.support.helpers import assert_eventually
from tests.support.router_harness import events_of, ignore_batch
from tests.support.worker_harness import (  # noqa: F401 - fixtures
    LocalDevice,
    client_for,
    device_fixture,
    queue_fixture,
    ticket,
)

ADMIN = "web:watchdog-admin"


def _settings(**watchdog: Any) -> Settings:
    return Settings(
        watchdog=WatchdogSettings(**({"stall_seconds": 600, "admin_thread": ADMIN} | watchdog))
    )


async def _running(pool: asyncpg.Pool, device: LocalDevice) -> tuple[str, str]:
    """A ticket with a running round and a session; returns (ticket, session)."""
    ticket_id, _ = await ticket(pool, device)
    started = await slots.start(
        pool,
        ticket_id,
        states=("open",),
        woken_by="new",
        owner="replica-x",
        lease=timedelta(minutes=5),
        max_workers=1000,
        human=False,
    )
    assert started is not None
    session_id = new_id("ses")
    await pool.execute(
        "INSERT INTO sessions (id, kind, ticket_id, model) VALUES ($1, 'worker', $2, 'm')",
        session_id,
        ticket_id,
    )
    await pool.execute(
        "UPDATE assignments SET session_id = $2 WHERE id = $1", started.id, session_id
    )
    return ticket_id, session_id


async def _say(pool: asyncpg.Pool, session_id: str, seq: int, message: dict[str, Any]) -> None:
    await pool.execute(
        "INSERT INTO session_messages (id, session_id, seq, role, content) "
        "VALUES ($1, $2, $3, $4, $5::text::jsonb)",
        new_id("msg"),
        session_id,
        seq,
        message["role"],
        json.dumps({"message": message}),
    )


async def _age(pool: asyncpg.Pool, ticket_id: str, minutes: float) -> None:
    """Make the round's last activity ``minutes`` old."""
    ago = timedelta(minutes=minutes)
    await pool.execute(
        "UPDATE assignments SET created_at = now() - $2::interval WHERE ticket_id = $1",
        ticket_id,
        ago,
    )
    await pool.execute(
        "UPDATE session_messages SET created_at = now() - $2::interval "
        "WHERE session_id IN (SELECT session_id FROM assignments WHERE ticket_id = $1)",
        ticket_id,
        ago,
    )


async def _actions(pool: asyncpg.Pool, kind: str, subject: str) -> list[str]:
    rows = await pool.fetch(
        "SELECT a.action FROM watchdog_actions a JOIN watchdog_findings f ON f.id = a.finding_id "
        "WHERE f.kind = $1 AND f.subject = $2 ORDER BY a.created_at",
        kind,
        subject,
    )
    return [row["action"] for row in rows]


async def _alerts(pool: asyncpg.Pool) -> list[str]:
    rows = await pool.fetch(
        "SELECT e.payload FROM effects e JOIN threads t ON t.id = e.payload->>'thread_id' "
        "WHERE e.kind = $1 AND t.source = 'web' AND t.external_id = 'watchdog-admin'",
        EffectKind.REPLY,
    )
    return [
        (json.loads(r["payload"]) if isinstance(r["payload"], str) else r["payload"])["text"]
        for r in rows
    ]


@pytest.fixture
async def unpaused(pool: asyncpg.Pool) -> AsyncIterator[None]:
    yield
    await pool.execute("DELETE FROM pause")  # never leave the shared database paused


async def test_a_stalled_worker_is_nudged_then_requeued_then_stopped(
    pool: asyncpg.Pool, device: LocalDevice
) -> None:
    ticket_id, session_id = await _running(pool, device)
    await _say(pool, session_id, 1, {"role": "user", "content": "the brief"})
    dog = Watchdog(pool, _settings(), None)
    await _age(pool, ticket_id, 5)
    await dog.check_once()
    assert await _actions(pool, "stalled", ticket_id) == []  # 5 minutes: fine

    await _age(pool, ticket_id, 12)
    await dog.check_once()
    assert await _actions(pool, "stalled", ticket_id) == ["nudge"]
    nudge = await pool.fetchval(
        "SELECT text FROM worker_events WHERE ticket_id = $1 AND kind = 'watchdog'", ticket_id
    )
    assert "no progress from you for 12 minutes" in nudge
    await dog.check_once()  # the same rung is not repeated
    assert await _actions(pool, "stalled", ticket_id) == ["nudge"]

    await _age(pool, ticket_id, 25)
    await dog.check_once()
    assert await _actions(pool, "stalled", ticket_id) == ["nudge", "requeue"]
    owner = await pool.fetchval(
        "SELECT lease_owner FROM assignments WHERE ticket_id = $1 AND ended_at IS NULL",
        ticket_id,
    )
    assert owner == "watchdog"  # its replica lets go; any replica takes the round over

    await _age(pool, ticket_id, 35)
    await dog.check_once()
    assert await _actions(pool, "stalled", ticket_id) == ["nudge", "requeue", "stop", "alert"]
    assert await pool.fetchval("SELECT state FROM tickets WHERE id = $1", ticket_id) == "stopped"
    assert any(f"stopped {ticket_id}" in text for text in await _alerts(pool))
    thread = await reports.home_thread(pool, ticket_id)
    told = await pool.fetchval(
        "SELECT payload->>'text' FROM effects WHERE kind = $1 AND payload->>'thread_id' = $2",
        EffectKind.REPLY,
        thread,
    )
    assert f"I stopped {ticket_id}" in told


async def test_a_worker_with_a_running_job_is_not_stalled(
    pool: asyncpg.Pool, device: LocalDevice, queue: Any
) -> None:
    ticket_id, session_id = await _running(pool, device)
    await _say(pool, session_id, 1, {"role": "user", "content": "the brief"})
    await device.offline()  # the command stays queued: a job still unfinished
    command_id = await pool.fetchval(
        "INSERT INTO commands (id, device_id, ticket_id, seq, kind, spec, not_after) "
        "VALUES ($1, $2, $3, 1, 'exec', '{}', now() + interval '1 hour') RETURNING id",
        new_id("cmd"),
        device.id,
        ticket_id,
    )
    await pool.execute(
        "INSERT INTO jobs (command_id, ticket_id, script, background) "
        "VALUES ($1, $2, 'make all', true)",
        command_id,
        ticket_id,
    )
    await _age(pool, ticket_id, 60)
    await Watchdog(pool, _settings(), None).check_once()
    assert await _actions(pool, "stalled", ticket_id) == []


async def test_a_looping_worker_is_nudged_then_stopped(
    pool: asyncpg.Pool, device: LocalDevice
) -> None:
    ticket_id, session_id = await _running(pool, device)
    for seq in range(1, 7):
        await _say(
            pool,
            session_id,
            seq,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{seq}",
                        "type": "function",
                        "function": {"name": "shell", "arguments": '{"command": "make"}'},
                    }
                ],
            },
        )
    dog = Watchdog(pool, _settings(), None)
    await dog.check_once()
    assert await _actions(pool, "looping", ticket_id) == ["nudge"]
    await dog.check_once()
    await dog.check_once()
    assert await _actions(pool, "looping", ticket_id) == ["nudge", "stop", "alert"]
    assert await pool.fetchval("SELECT state FROM tickets WHERE id = $1", ticket_id) == "stopped"


async def test_failing_model_calls_alert_and_can_pause_the_agent(
    pool: asyncpg.Pool, unpaused: None
) -> None:
    session_id = new_id("ses")
    await pool.execute(
        "INSERT INTO sessions (id, kind, model) VALUES ($1, 'router', 'm')", session_id
    )
    for n in range(6):
        await pool.execute(
            "INSERT INTO llm_calls (id, session_id, model, latency_ms, error, created_at, "
            "prompt_tokens, completion_tokens, cached_tokens, batch_size, cost_usd) "
            "VALUES ($1, $2, 'm', 5, $3, now() + $4::interval, 0, 0, 0, 1, 0)",
            new_id("llm"),
            session_id,
            f"Error code: 503 - upstream down ({n})",
            timedelta(milliseconds=n),
        )
    await Watchdog(pool, _settings(error_streak=5, pause_after_errors=6), None).check_once()
    assert await _actions(pool, "llm_errors", "router") == ["alert", "pause"]
    assert any("router model calls failed" in text for text in await _alerts(pool))
    paused = await pool.fetchrow("SELECT paused_by, reason FROM pause")
    assert paused is not None
    assert paused["paused_by"] == "the watchdog"
    # A success ends the streak: the finding resolves.
    await pool.execute(
        "INSERT INTO llm_calls (id, session_id, model, latency_ms, created_at, "
        "prompt_tokens, completion_tokens, cached_tokens, batch_size, cost_usd) "
        "VALUES ($1, $2, 'm', 5, now() + interval '1 second', 0, 0, 0, 1, 0)",
        new_id("llm"),
        session_id,
    )
    await Watchdog(pool, _settings(), None).check_once()
    assert not await pool.fetchval(
        "SELECT count(*) FROM watchdog_findings WHERE kind = 'llm_errors' AND subject = 'router' "
        "AND resolved_at IS NULL"
    )


async def test_a_silent_replica_is_reported_once_and_resolved_when_it_beats(
    pool: asyncpg.Pool,
) -> None:
    replica = f"host:{new_id('dev')}"
    await pool.execute(
        "INSERT INTO replicas (id, hostname, version, heartbeat_at) "
        "VALUES ($1, 'host', '1', now() - interval '5 minutes')",
        replica,
    )
    dog = Watchdog(pool, _settings(), None)
    await dog.check_once()
    await dog.check_once()
    assert await _actions(pool, "replica_silent", replica) == ["alert"]
    assert sum(replica in text for text in await _alerts(pool)) == 1
    await pool.execute("UPDATE replicas SET heartbeat_at = now() WHERE id = $1", replica)
    await dog.check_once()
    resolved = await pool.fetchval(
        "SELECT resolved_at FROM watchdog_findings WHERE kind = 'replica_silent' AND subject = $1",
        replica,
    )
    assert resolved is not None


async def test_commands_past_their_expiry_are_expired_so_their_ticket_hears(
    pool: asyncpg.Pool, device: LocalDevice
) -> None:
    await device.offline()
    command_id = await pool.fetchval(
        "INSERT INTO commands (id, device_id, seq, kind, spec, not_after) "
        "VALUES ($1, $2, 1, 'exec', '{}', now() - interval '1 minute') RETURNING id",
        new_id("cmd"),
        device.id,
    )
    await Watchdog(pool, _settings(), None).check_once()
    assert await _actions(pool, "queue_expired", device.id) == ["expire"]
    assert await pool.fetchval("SELECT state FROM commands WHERE id = $1", command_id) == "expired"


async def test_postgres_coming_back_is_recorded_and_alerted(pool: asyncpg.Pool) -> None:
    dog = Watchdog(pool, _settings(), None)
    dog.down_since = (await pool.fetchval("SELECT now()")) - timedelta(seconds=42)
    await dog.check_once()
    row = await pool.fetchrow(
        "SELECT summary, resolved_at FROM watchdog_findings WHERE kind = 'postgres_unreachable' "
        "ORDER BY first_seen_at DESC LIMIT 1"
    )
    assert row is not None
    assert "(42 s)" in row["summary"]
    assert row["resolved_at"] is not None
    assert dog.down_since is None


async def test_postgres_away_ends_passes_not_the_watchdog_and_its_return_is_recorded(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The running watchdog: passes that fail on the database are one outage (one error
    line), the watchdog goes on at its interval, and the first pass after records the
    episode and alerts."""
    away = [ConnectionRefusedError("connection refused"), asyncpg.InterfaceError("closed")]
    check_once = Watchdog.check_once

    async def postgres_away(self: Watchdog) -> list[Any]:
        if away:  # the pass's first statement fails: the database is gone
            raise away.pop(0)
        return await check_once(self)

    monkeypatch.setattr(Watchdog, "check_once", postgres_away)
    caplog.set_level(logging.DEBUG, logger="controlplane.watchdog.service")
    dog = Watchdog(pool, _settings(interval_seconds=0.05), None)
    await dog.start()
    try:
        await assert_eventually(
            lambda: pool.fetchval(
                "SELECT resolved_at IS NOT NULL FROM watchdog_findings "
                "WHERE kind = 'postgres_unreachable'"
            ),
            timeout=15,
            message="the outage recorded once it was over",
        )
        assert not dog.task.done(), "the outage ended the watchdog"
    finally:
        await dog.stop()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage().split(" (")[0] for r in errors] == [
        "watchdog: Postgres unreachable or failing"
    ]
    assert any("Postgres was unreachable" in text for text in await _alerts(pool))


async def test_drift_from_the_goal_is_judged_by_the_model_and_nudged(
    pool: asyncpg.Pool, device: LocalDevice, fake_llm: FakeOpenAIServer
) -> None:
    ticket_id, session_id = await _running(pool, device)
    await _say(
        pool,
        session_id,
        1,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "shell", "arguments": '{"command": "vim ~/.bashrc"}'},
                }
            ],
        },
    )
    await pool.execute(
        "UPDATE assignments SET created_at = now() - interval '2 hours' WHERE ticket_id = $1",
        ticket_id,
    )
    fake_llm.script(Reply(content='{"on_goal": false, "why": "it edits shell dotfiles."}'))
    settings = _settings(drift_seconds=1800)
    await Watchdog(pool, settings, client_for(fake_llm)).check_once()
    asked = fake_llm.requests[-1].json_body
    assert isinstance(asked, dict)
    assert "vim ~/.bashrc" in asked["messages"][-1]["content"]
    assert await _actions(pool, "drift", ticket_id) == ["nudge"]
    nudge = await pool.fetchval(
        "SELECT text FROM worker_events WHERE ticket_id = $1 AND kind = 'watchdog'", ticket_id
    )
    assert "it edits shell dotfiles." in nudge
    # The watchdog's call is on record in its own session, and on the ticket's bill, at the
    # price of the model it ran on: the router's, not the worker's.
    call = await pool.fetchrow(
        "SELECT c.model, c.prompt_tokens, c.cached_tokens, c.completion_tokens, c.cost_usd "
        "FROM llm_calls c JOIN sessions s ON s.id = c.session_id WHERE s.kind = 'watchdog'"
    )
    assert call is not None
    assert call["model"] == settings.llm.router_model != settings.llm.worker_model
    tokens = (call["prompt_tokens"], call["cached_tokens"], call["completion_tokens"])
    assert call["cost_usd"] == PriceBook().cost(call["model"], *tokens).quantize(Decimal("1e-6"))
    assert call["cost_usd"] != PriceBook().cost(settings.llm.worker_model, *tokens)
    billed = await pool.fetchrow(
        "SELECT tokens_used, cost_usd FROM tickets WHERE id = $1", ticket_id
    )
    assert billed is not None
    assert (billed["tokens_used"], billed["cost_usd"]) == (
        call["prompt_tokens"] + call["completion_tokens"],
        call["cost_usd"],
    )


async def test_why_is_it_stuck_is_answered_from_the_record(
    pool: asyncpg.Pool, device: LocalDevice, database_url: str, queue: Any
) -> None:
    ticket_id, _ = await ticket(pool, device, title="fix the parser")
    await reports.finish(
        pool, ticket_id, None, {"status": "blocked", "summary": "the tests need a database"}
    )
    found = await explain.facts(pool, ticket_id)
    assert found is not None
    assert (found["state"], found["why"]) == ("waiting_human", "blocked")
    assert found["last_report"]["summary"] == "the tests need a database"
    text = explain.render(found)
    assert f'{ticket_id} "fix the parser" is waiting_human (blocked).' in text
    assert "blocked: the tests need a database" in text

    cli = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "controlplane.cli", "watchdog", "why", ticket_id],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DATABASE_URL": database_url},
    )
    assert cli.returncode == 0, cli.stderr
    assert "the tests need a database" in cli.stdout

    # Rules-only mode answers /why the same way.
    router = RulesOnlyRouter(pool, queue)
    answer = await router._why(_event(), ticket_id)
    assert "waiting_human (blocked)" in answer


def _event() -> Any:
    from controlplane.router.batch import Event

    return Event(
        id="trg_000000000000",
        source="web",
        thread_id="thr_000000000000",
        thread_title=None,
        actor_name="alice",
        actor_is_bot=False,
        kind="message",
        text="/why",
        verdict="explicit",
        created_at=None,  # type: ignore[arg-type]
    )


def test_watchdog_once_runs_a_pass_from_the_command_line(database_url: str, tmp_path: Path) -> None:
    cli = subprocess.run(
        [sys.executable, "-m", "controlplane.cli", "watchdog", "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DATABASE_URL": database_url, "SUPERAGENT_STATE_DIR": str(tmp_path)},
    )
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.strip()
    assert "Traceback" not in cli.stderr


async def test_an_admin_asks_why_and_the_router_answers_from_the_record(
    pool: asyncpg.Pool, device: LocalDevice, fake_llm: FakeOpenAIServer
) -> None:
    """ "why is tkt_x stuck?" in the admin channel: the router calls ``explain`` and answers
    with what the record says (here: the question the worker is waiting on)."""
    ticket_id, _ = await ticket(pool, device, title="upgrade the ORM")
    await reports.finish(
        pool,
        ticket_id,
        None,
        {"status": "question", "summary": "two migrations conflict", "question": "keep which?"},
    )
    intake = Intake(pool)
    asked = await intake.ingest(
        IncomingTrigger(
            source="web",
            external_id=new_id("msg"),
            thread=ThreadRef("watchdog-admin"),
            actor=Actor("root", "root", groups=("console",)),
            kind="message",
            text=f"@superagent why is {ticket_id} stuck?",
            direct=True,
        )
    )
    assert asked.verdict == "explicit"

    def router(request: ChatRequest) -> Reply:
        last = request.last_message() or {}
        if last.get("role") == "tool":
            found = json.loads(str(last["content"]))
            answer = f"{found['ticket']} waits for people: {found['last_report']['question']}"
            # The worker's report may share the batch (passed on to its own thread): not
            # what this test is about.
            others = [
                ToolCall("reply", {"thread": thread, "text": "The worker asks: keep which?"})
                for t, thread, _ in events_of(request)
                if t != asked.trigger_id
            ]
            return Reply(
                tool_calls=[ToolCall("reply", {"thread": asked.thread_id, "text": answer}), *others]
            )
        if ticket_id in (request.last_user_message() or ""):
            return Reply(tool_calls=[ToolCall("explain", {"ticket": ticket_id})])
        return ignore_batch(request)

    fake_llm.respond_with(router)
    routing = Router(pool, client_for(fake_llm), "fake-model", policy=intake.policy)
    while await routing.turn():
        pass
    replies = await pool.fetch(
        "SELECT payload->>'text' AS text FROM effects WHERE kind = $1 "
        "AND payload->>'thread_id' = $2",
        EffectKind.REPLY,
        asked.thread_id,
    )
    assert [r["text"] for r in replies] == [f"{ticket_id} waits for people: keep which?"]
