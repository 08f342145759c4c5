"""Slack Socket Mode end to end: a fake Slack's websocket delivers envelopes, they become
Triggers, and each is acknowledged only once it is recorded."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest
from pydantic import SecretStr
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.channels.slack import SlackAdapter
from controlplane.ingest.admission import Admission, SourceAdmission
from controlplane.ingest.intake import Intake
from controlplane.services import Service
from controlplane.settings import SlackSettings
from tests.fakes.slack_server import APP_TOKEN, BOT_TOKEN, BOT_USER, TEAM_ID, Failure, FakeSlack
from tests.support.helpers import assert_eventually, save_policy

ALICE = "U0ALICE"
ALICE_ID = f"{TEAM_ID}/{ALICE}"  # her actor id: team and user


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with FakeSlack() as fake:
        fake.add_user(ALICE, "alice")
        fake.add_channel("C0GENERAL")
        yield fake


def _adapter(slack: FakeSlack, pool: asyncpg.Pool, app_token: str = APP_TOKEN) -> SlackAdapter:
    settings = SlackSettings(
        bot_token=SecretStr(BOT_TOKEN), app_token=SecretStr(app_token), api_url=slack.api_url
    )
    return SlackAdapter(settings, Intake(pool))


async def _running(adapter: SlackAdapter) -> Service:
    (service,) = adapter.services()
    await service.start()
    return service


@pytest.fixture
async def connected(
    slack: FakeSlack, pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession]
) -> AsyncIterator[SlackAdapter]:
    await save_policy(db, Admission(sources={"slack": SourceAdmission(users=[ALICE_ID])}))
    adapter = _adapter(slack, pool)
    service = await _running(adapter)
    try:
        await assert_eventually(lambda: slack.open_sockets == 1, message="connected")
        yield adapter
    finally:
        await service.stop(5)
        assert service.task.done()
        await adapter.close()


async def _trigger(pool: asyncpg.Pool, event_id: str) -> asyncpg.Record | None:
    return await pool.fetchrow(
        "SELECT t.*, th.external_id AS thread_external_id FROM triggers t "
        "JOIN threads th ON th.id = t.thread_id WHERE t.external_id = $1",
        event_id,
    )


async def _acked_after_recorded(slack: FakeSlack, pool: asyncpg.Pool, envelope: str) -> bool:
    if envelope not in slack.acks:
        return False
    # The ack goes out only after ingest committed: by now the trigger must be there.
    count = await pool.fetchval("SELECT count(*) FROM triggers")
    assert count, "acknowledged before the trigger was recorded"
    return True


@pytest.mark.usefixtures("connected")
async def test_an_envelope_becomes_a_trigger_and_is_acknowledged(
    slack: FakeSlack, pool: asyncpg.Pool
) -> None:
    event = slack.say("C0GENERAL", ALICE, f"<@{BOT_USER}> the tests are red")
    envelope = slack.push(event)
    await assert_eventually(lambda: _acked_after_recorded(slack, pool, envelope))
    row = await _trigger(pool, event["event_id"])
    assert row is not None
    assert row["thread_external_id"] == f"C0GENERAL:{event['event']['ts']}"
    assert (row["actor_id"], row["actor_name"], row["verdict"]) == (ALICE_ID, "alice", "explicit")
    # Slack redelivers (say the ack was lost): acknowledged again, nothing new recorded.
    again = slack.push(event, retry_attempt=1)
    await assert_eventually(lambda: again in slack.acks)
    assert await pool.fetchval("SELECT count(*) FROM triggers") == 1
    # Envelopes the agent does not act on are acknowledged too, so Slack stops resending.
    ours = slack.callback({**event["event"], "user": BOT_USER, "type": "message"})
    skipped = slack.push(ours)
    await assert_eventually(lambda: skipped in slack.acks)
    assert await pool.fetchval("SELECT count(*) FROM triggers") == 1


@pytest.mark.usefixtures("connected")
async def test_an_envelope_that_cannot_be_recorded_is_not_acknowledged(
    slack: FakeSlack, pool: asyncpg.Pool
) -> None:
    slack.add_user("U0NEW", "newcomer")
    event = slack.say("C0GENERAL", "U0NEW", f"<@{BOT_USER}> hi")
    slack.fail_next("users.info", Failure(status=503))  # who wrote it cannot be told yet
    lost = slack.push(event)
    await assert_eventually(lambda: len(slack.calls_to("users.info")) == 1)
    retried = slack.push(event, retry_attempt=1)  # Slack's redelivery of the unacked one
    await assert_eventually(lambda: _acked_after_recorded(slack, pool, retried))
    assert lost not in slack.acks
    assert await pool.fetchval("SELECT count(*) FROM triggers") == 1


async def test_a_bug_while_ingesting_an_envelope_fails_that_envelope_only(
    slack: FakeSlack,
    pool: asyncpg.Pool,
    connected: SlackAdapter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    receive = connected.receive
    broken = {"once": True}

    async def buggy(payload: dict[str, Any], *, retried: bool = False) -> Any:
        if broken.pop("once", False):
            return [][0]  # an IndexError in our own code
        return await receive(payload, retried=retried)

    monkeypatch.setattr(connected, "receive", buggy)
    event = slack.say("C0GENERAL", ALICE, f"<@{BOT_USER}> first")
    lost = slack.push(event)
    failed = await assert_eventually(
        lambda: pool.fetchrow("SELECT loop, item_id, error_class, error FROM item_failures"),
        message="the failure on record",
    )
    assert (failed["loop"], failed["item_id"], failed["error_class"]) == ("slack", lost, "internal")
    assert "IndexError" in failed["error"]
    assert lost not in slack.acks  # not acknowledged: Slack delivers it again
    retried = slack.push(event, retry_attempt=1)
    await assert_eventually(lambda: _acked_after_recorded(slack, pool, retried))


async def test_a_disconnect_reconnects_at_once_with_a_new_url(
    slack: FakeSlack, pool: asyncpg.Pool, connected: SlackAdapter
) -> None:
    assert slack.connections_opened == 1
    slack.disconnect("refresh_requested")
    await assert_eventually(lambda: slack.connections_opened == 2 and slack.open_sockets == 1)
    event = slack.say("C0GENERAL", ALICE, f"<@{BOT_USER}> still there?")
    envelope = slack.push(event)
    await assert_eventually(lambda: _acked_after_recorded(slack, pool, envelope))


async def test_connection_errors_back_off_and_retry(slack: FakeSlack, pool: asyncpg.Pool) -> None:
    slack.fail_next("apps.connections.open", Failure(status=500))
    slack.fail_next("apps.connections.open", Failure(status=429, retry_after=1))
    adapter = _adapter(slack, pool)
    service = await _running(adapter)
    try:
        await assert_eventually(lambda: slack.open_sockets == 1, timeout=15)
        assert len(slack.calls_to("apps.connections.open")) == 3
    finally:
        await service.stop(5)
        await adapter.close()


async def test_a_refused_app_token_is_reported_without_stopping_the_process(
    slack: FakeSlack, pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    adapter = _adapter(slack, pool, app_token="xapp-1-revoked")
    service = await _running(adapter)
    try:
        await assert_eventually(lambda: slack.calls_to("apps.connections.open"))
        await assert_eventually(lambda: "SUPERAGENT_SLACK__APP_TOKEN" in caplog.text)
        assert not service.task.done()  # it waits to retry; the control plane keeps running
        assert "xapp-1-revoked" not in caplog.text
    finally:
        await service.stop(5)
        await adapter.close()
    assert service.task.done()


def test_tokens_in_the_wrong_settings_are_refused_at_startup() -> None:
    values: dict[str, Any] = {"bot_token": SecretStr(APP_TOKEN)}
    with pytest.raises(ValueError, match="xoxb-"):
        SlackSettings(**values)
    with pytest.raises(ValueError, match="xapp-"):
        SlackSettings(bot_token=SecretStr(BOT_TOKEN), app_token=SecretStr(BOT_TOKEN))
