"""Rules-only mode: slash commands work without a model; anything else gets one notice."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.domain import EffectKind
from controlplane.effects.handlers import ClaimedEffect, Postpone
from controlplane.gateway import authorization as access
from controlplane.gateway import specs
from controlplane.gateway.delivery import CommandDelivery
from controlplane.gateway.queue import CommandQueue
from controlplane.ingest.admission import Actor, Admission, SourceAdmission
from controlplane.ingest.intake import IncomingTrigger, Ingested, Intake, ThreadRef
from controlplane.router.rules_only import NOTICE, RulesOnlyRouter, parse, run_handler
from controlplane.tickets import device_grant
from superagent_shared.ids import new_id
from tests.support.helpers import save_policy

ALICE = Actor("u-1", "alice")
MALLORY = Actor("u-6", "mallory")


@pytest.fixture
async def pool(pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession]) -> asyncpg.Pool:
    """The shared pool, with this module's policy saved and a device paired (Alice's: only
    she may run things there)."""
    await save_policy(db, Admission(default=SourceAdmission(users=[ALICE.id])))  # by actor id
    await pool.execute(
        "INSERT INTO devices (id, name, owner, public_key, version) "
        "VALUES ($1, 'laptop', 'github:u-1', $2, '1')",
        new_id("dev"),
        b"k" * 32,
    )
    return pool


@pytest.fixture
async def queue(pool: asyncpg.Pool) -> AsyncIterator[CommandQueue]:
    queue = CommandQueue(pool)
    yield queue
    await queue.close()


@pytest.fixture
def router(pool: asyncpg.Pool, queue: CommandQueue) -> RulesOnlyRouter:
    return RulesOnlyRouter(pool, queue)


async def _say(
    pool: asyncpg.Pool, n: int, text: str, actor: Actor = ALICE, thread: str = "t1"
) -> Ingested:
    return await Intake(pool).ingest(
        IncomingTrigger(
            source="github",
            external_id=f"c-{n}",
            thread=ThreadRef(thread),
            actor=actor,
            kind="issue_comment",
            text=text,
        )
    )


def _json(value: object) -> dict[str, object]:
    parsed = json.loads(value) if isinstance(value, str) else value
    assert isinstance(parsed, dict)
    return parsed


async def _replies(pool: asyncpg.Pool) -> list[tuple[str, str]]:
    rows = await pool.fetch(
        "SELECT payload FROM effects WHERE kind = $1 ORDER BY created_at, id", EffectKind.REPLY
    )
    payloads = [_json(r["payload"]) for r in rows]
    return [(str(p["thread_id"]), str(p["text"])) for p in payloads]


def test_slash_commands_are_found_after_a_mention_and_nowhere_else() -> None:
    assert parse("@superagent /run laptop pytest -x") == ("run", "laptop pytest -x")
    assert parse("/tickets") == ("tickets", "")
    assert parse("look in /usr/bin/run") is None
    assert parse("see http://example.com/run/x") is None
    assert parse("/stop_words please") is None


async def test_lists_and_a_notice_once_per_thread(
    router: RulesOnlyRouter, pool: asyncpg.Pool
) -> None:
    tickets = await _say(pool, 1, "@superagent /tickets")
    devices = await _say(pool, 2, "@superagent /devices", thread="t2")
    chat = await _say(pool, 3, "@superagent can you refactor this?")
    again = await _say(pool, 4, "@superagent hello?")
    elsewhere = await _say(pool, 5, "@superagent hi", thread="t3")
    assert await router.turn() == 5
    replies = await _replies(pool)
    assert (tickets.thread_id, "No active tickets.") in replies
    assert (devices.thread_id, "Devices:\n- laptop: offline") in replies
    notices = [thread for thread, text in replies if text == NOTICE]
    # One on the thread of the two plain messages, one on the other thread.
    assert sorted(notices) == sorted([chat.thread_id, elsewhere.thread_id])
    assert again.thread_id == chat.thread_id
    assert await router.turn() == 0


async def test_only_explicit_requests_run_anything(
    router: RulesOnlyRouter, pool: asyncpg.Pool
) -> None:
    await _say(pool, 1, "@superagent /run laptop rm -rf /", actor=MALLORY)
    await router.turn()  # dropped at ingest: never even reaches the router
    assert await pool.fetchval("SELECT count(*) FROM effects") == 0
    assert await pool.fetchval("SELECT count(*) FROM commands") == 0


async def test_run_queues_once_and_reports_the_result(
    router: RulesOnlyRouter, pool: asyncpg.Pool, queue: CommandQueue
) -> None:
    asked = await _say(pool, 1, "@superagent /run laptop echo 'hello world'")
    bad = await _say(pool, 2, "@superagent /run nowhere true", thread="t2")
    await router.turn()
    replies = dict(await _replies(pool))
    assert (
        replies[asked.thread_id]
        == "Running on laptop: echo 'hello world' (the result follows here)"
    )
    assert "no paired device 'nowhere'" in replies[bad.thread_id]
    effect = await pool.fetchrow("SELECT * FROM effects WHERE kind = $1", EffectKind.RUN_COMMAND)
    assert effect is not None
    payload = _json(effect["payload"])
    claimed = ClaimedEffect(effect["id"], EffectKind.RUN_COMMAND, effect["key"], payload, 1, 1)
    handler = run_handler(pool, queue)
    for _ in range(2):  # retried before the command is final: still one command
        with pytest.raises(Postpone):
            await handler(claimed)
    command = await pool.fetchrow("SELECT id, spec, device_id FROM commands")
    assert command is not None
    assert await pool.fetchval("SELECT count(*) FROM commands") == 1
    # The device's policy holds it for a human: the thread is told once, whatever the retries.
    delivery = CommandDelivery(pool)
    await delivery.mark_awaiting_approval(
        command["device_id"],
        command["id"],
        rule='ask-first "*echo*"',
        deadline=datetime.now(UTC) + timedelta(minutes=5),
    )
    for _ in range(3):
        with pytest.raises(Postpone):
            await handler(claimed)
    notices = await pool.fetch(
        "SELECT payload->>'text' AS text FROM effects WHERE kind = $1 "
        "AND payload->>'text' LIKE '%waits for local approval%'",
        EffectKind.REPLY,
    )
    assert len(notices) == 1
    assert 'rule: ask-first "*echo*"' in notices[0]["text"]
    await delivery.finish(
        command["device_id"],
        command["id"],
        state="finished",
        exit_code=0,
        signal=0,
        error=None,
        refusal_reason=None,
        timed_out=False,
        output_truncated=False,
        total_output_bytes=0,
    )
    await handler(claimed)
    assert (asked.thread_id, f"{command['id']} exit 0.") in await _replies(pool)


async def test_stop_revokes_the_mandate_and_subscriptions(
    router: RulesOnlyRouter, pool: asyncpg.Pool, queue: CommandQueue
) -> None:
    first = await _say(pool, 1, "first message")
    thread = first.thread_id
    ticket = new_id("tkt")
    await pool.execute("INSERT INTO tickets (id, title, state) VALUES ($1, 'x', 'running')", ticket)
    await pool.execute(
        "INSERT INTO mandates (id, ticket_id, kind, initiator_id, initiator_name, scope, "
        "trigger_id) VALUES ($1, $2, 'explicit', 'u-1', 'alice', 'x', $3)",
        new_id("mnd"),
        ticket,
        first.trigger_id,
    )
    async with pool.acquire() as conn:  # on Alice's laptop, for Alice
        await device_grant.grant_ticket(
            conn,
            ticket,
            await access.device(conn, "laptop"),
            await access.requester_of_ticket(conn, ticket),
            by="the test",
            what=ticket,
        )
    await pool.execute(
        "INSERT INTO subscriptions (thread_id, ticket_id) VALUES ($1, $2)", thread, ticket
    )
    running = await queue.submit("laptop", specs.Exec(["sleep", "100"]), ticket_id=ticket)
    stop = await _say(pool, 2, f"@superagent /stop {ticket}", thread="t9")
    await router.turn()
    assert await pool.fetchval("SELECT state FROM tickets WHERE id = $1", ticket) == "stopped"
    assert await pool.fetchval("SELECT revoked_at IS NOT NULL FROM mandates") is True
    assert await pool.fetchval("SELECT count(*) FROM subscriptions") == 0
    assert (await queue.result(running)).state == "cancelled"
    replies = dict(await _replies(pool))
    assert replies[stop.thread_id].startswith(f"Stopped {ticket}")
