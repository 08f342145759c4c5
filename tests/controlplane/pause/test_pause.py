"""Pause and resume: events are recorded while paused, and handled after resume."""

from __future__ import annotations

import asyncio
import json

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane import pause
from controlplane.channels.base import Channels
from controlplane.channels.outbound import reply_handler
from controlplane.db.urls import asyncpg_dsn
from controlplane.domain import EffectKind
from controlplane.effects.handlers import ClaimedEffect, Postpone
from controlplane.gateway.queue import CommandQueue
from controlplane.ingest.admission import Actor, Admission, SourceAdmission
from controlplane.ingest.intake import IncomingTrigger, Intake, ThreadRef
from controlplane.leadership import Leadership
from controlplane.router.rules_only import RulesOnlyRouter, run_handler
from controlplane.router.service import RouterService
from tests.support.helpers import assert_eventually, run_cli, save_policy


@pytest.fixture
async def pool(pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession]) -> asyncpg.Pool:
    """The shared pool, with this module's policy saved."""
    await save_policy(db, Admission(default=SourceAdmission(users=["u-1"])))  # alice's actor id
    return pool


def test_pause_and_resume_from_the_command_line(
    db: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    paused = run_cli(database_url, "pause", "--reason", "deploying", "--by", "ops")
    assert paused.returncode == 0, paused.stderr
    assert "paused" in paused.stdout
    again = run_cli(database_url, "pause", "--by", "someone-else")
    assert "by ops" in again.stdout  # the first pause's record stands
    status = json.loads(run_cli(database_url, "status", "--json").stdout)
    assert (status["paused_by"], status["paused_reason"]) == ("ops", "deploying")
    assert "PAUSED" in run_cli(database_url, "status").stdout
    assert "resumed" in run_cli(database_url, "resume").stdout
    assert "was not paused" in run_cli(database_url, "resume").stdout
    assert json.loads(run_cli(database_url, "status", "--json").stdout)["paused_at"] is None


async def test_events_wait_while_paused_and_are_handled_after_resume(
    pool: asyncpg.Pool, database_url: str
) -> None:
    queue = CommandQueue(pool)
    leadership = Leadership(pool, "me", lease_seconds=10, renew_seconds=1)
    service = RouterService(
        RulesOnlyRouter(pool, queue), leadership, asyncpg_dsn(database_url), pool
    )
    await pause.pause(pool, "test")
    await leadership.start()
    await service.start()
    try:
        await asyncio.wait_for(leadership.gained.wait(), 10)
        asked = await Intake(pool).ingest(
            IncomingTrigger(
                source="github",
                external_id="c-1",
                thread=ThreadRef("t"),
                actor=Actor("u-1", "alice"),
                kind="comment",
                text="@superagent /tickets",
            )
        )
        await asyncio.sleep(2.5)  # more than two of the router's polls
        assert await pool.fetchval(
            "SELECT routed_at IS NULL FROM triggers WHERE id = $1", asked.trigger_id
        )
        assert await pool.fetchval("SELECT count(*) FROM effects") == 0
        await pause.resume(pool)

        async def answered() -> bool:
            return bool(await pool.fetchval("SELECT count(*) FROM effects"))

        await assert_eventually(answered, timeout=10)
    finally:
        await service.stop()
        await leadership.stop()
        await queue.close()


async def test_commands_are_not_started_while_paused(pool: asyncpg.Pool) -> None:
    queue = CommandQueue(pool)
    try:
        await pause.pause(pool, "test")
        effect = ClaimedEffect(
            "eff_x",
            EffectKind.RUN_COMMAND,
            "trg_x",
            {
                "trigger_id": "trg_x",
                "thread_id": "thr_x",
                "device": "d",
                "argv": ["true"],
                "actor": "a",
            },
            1,
            1,
        )
        with pytest.raises(Postpone, match="paused"):
            await run_handler(pool, queue)(effect)
        assert await pool.fetchval("SELECT count(*) FROM commands") == 0
    finally:
        await queue.close()


async def test_replies_wait_in_the_outbox_for_their_channel_and_for_resume(
    pool: asyncpg.Pool,
) -> None:
    send = reply_handler(pool, Channels())
    effect = ClaimedEffect(
        "eff_x", EffectKind.REPLY, "msg_x", {"source": "github", "text": "hi"}, 1, 1
    )
    with pytest.raises(Postpone, match="github is not configured") as waiting:
        await send(effect)
    assert waiting.value.seconds >= 60  # kept, not retried into a dead letter
    await pause.pause(pool, "test")
    with pytest.raises(Postpone, match="paused"):
        await send(effect)
