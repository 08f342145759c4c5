"""Slack over the Events API: signed requests become Triggers on Slack threads; replies and 👀
go back through the outbox to a fake Slack speaking the real Web API."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.api.app import create_app
from controlplane.channels.base import Channels
from controlplane.channels.outbound import acknowledge_handler, reply_handler
from controlplane.channels.slack import SlackAdapter
from controlplane.channels.slack.signing import sign
from controlplane.db.urls import asyncpg_dsn
from controlplane.domain import EffectKind
from controlplane.effects.handlers import ClaimedEffect, Handlers, Permanent, Postpone
from controlplane.effects.runner import EffectRunner
from controlplane.errors import TransientError
from controlplane.ingest.admission import Admission, SourceAdmission
from controlplane.ingest.intake import Intake
from controlplane.settings import EffectsSettings, Settings, SlackSettings
from controlplane.web.state import AppState
from superagent_shared.ids import new_id
from tests.fakes.slack_server import BOT_ID, BOT_TOKEN, BOT_USER, TEAM_ID, Failure, FakeSlack
from tests.support.helpers import assert_eventually, save_policy

SECRET = "slack-signing-secret-4411"
ALICE, BOB, MALLORY = "U0ALICE", "U0BOB", "U0MALLORY"
ALICE_ID = f"{TEAM_ID}/{ALICE}"  # her actor id: a user id is unique only within its team


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with FakeSlack() as fake:
        fake.add_user(ALICE, "alice")
        fake.add_user(BOB, "bob")
        fake.add_user(MALLORY, "mallory")
        fake.add_channel("C0GENERAL")
        fake.add_channel("D0ALICE")
        yield fake


def _settings(slack: FakeSlack, **overrides: Any) -> SlackSettings:
    values: dict[str, Any] = {
        "bot_token": SecretStr(BOT_TOKEN),
        "signing_secret": SecretStr(SECRET),
        "api_url": slack.api_url,
        **overrides,
    }
    return SlackSettings(**values)


@pytest.fixture
async def adapter(slack: FakeSlack, pool: asyncpg.Pool) -> AsyncIterator[SlackAdapter]:
    adapter = SlackAdapter(_settings(slack), Intake(pool))
    yield adapter
    await adapter.close()


@pytest.fixture
async def allowlist(db: async_sessionmaker[AsyncSession]) -> None:
    await save_policy(db, Admission(sources={"slack": SourceAdmission(users=[ALICE_ID])}))


def _client(
    pool: asyncpg.Pool, adapter: SlackAdapter | None, slack: SlackSettings
) -> httpx.AsyncClient:
    state = AppState(
        settings=Settings(slack=slack),
        replica_id="test",
        intake=adapter.intake if adapter else Intake(pool),
        pool=pool,
        channels=Channels([adapter] if adapter else []),
    )
    transport = httpx.ASGITransport(app=create_app(state), raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://test")


@pytest.fixture
async def client(pool: asyncpg.Pool, adapter: SlackAdapter) -> AsyncIterator[httpx.AsyncClient]:
    async with _client(pool, adapter, adapter.settings) as client:
        yield client


async def _post(
    client: httpx.AsyncClient,
    body: Any,
    *,
    secret: str = SECRET,
    at: float | None = None,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> httpx.Response:
    content = raw if raw is not None else json.dumps(body).encode()
    timestamp = str(int(time.time() if at is None else at))
    return await client.post(
        "/webhooks/slack",
        content=content,
        headers={
            "Content-Type": "application/json",
            "X-Slack-Request-Timestamp": timestamp,
            "X-Slack-Signature": sign(secret.encode(), timestamp, content),
            **(headers or {}),
        },
    )


async def _trigger(pool: asyncpg.Pool, event_id: str) -> asyncpg.Record:
    row = await pool.fetchrow(
        "SELECT t.*, th.external_id AS thread_external_id, th.title AS thread_title "
        "FROM triggers t JOIN threads th ON th.id = t.thread_id "
        "WHERE t.source = 'slack' AND t.external_id = $1",
        event_id,
    )
    assert row is not None, f"no trigger for {event_id}"
    return row


async def test_bad_requests_get_clear_errors_and_store_nothing(
    client: httpx.AsyncClient, slack: FakeSlack, pool: asyncpg.Pool
) -> None:
    event = slack.say("C0GENERAL", ALICE, f"<@{BOT_USER}> hello")
    forged = await _post(client, event, secret="not-the-secret")
    assert forged.status_code == 401
    assert "X-Slack-Signature" in forged.json()["error"]["message"]
    stale = await _post(client, event, at=time.time() - 301)
    assert stale.status_code == 401
    assert "5 minutes" in stale.json()["error"]["message"]
    unsigned = await client.post("/webhooks/slack", content=json.dumps(event))
    assert unsigned.status_code == 401
    malformed = await _post(client, None, raw=b"{not json")
    assert malformed.status_code == 400
    no_event = await _post(client, {"type": "event_callback", "event_id": "Ev1"})
    assert no_event.status_code == 400
    oversized = await _post(client, None, raw=b"x" * ((1 << 20) + 1))
    assert oversized.status_code == 413
    assert await pool.fetchval("SELECT count(*) FROM triggers") == 0
    # The same event, correctly signed within the window, is accepted.
    accepted = await _post(client, event, at=time.time() - 60)
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["trigger"]["duplicate"] is False


async def test_unconfigured_slack_answers_404_naming_the_setting(
    pool: asyncpg.Pool, slack: FakeSlack
) -> None:
    settings = _settings(slack, signing_secret=None)
    async with _client(pool, None, settings) as client:
        response = await _post(client, slack.say("C0GENERAL", ALICE, "hi"))
    assert response.status_code == 404
    assert "SUPERAGENT_SLACK__SIGNING_SECRET" in response.json()["error"]["message"]
    async with _client(pool, None, _settings(slack)) as client:
        response = await _post(client, slack.say("C0GENERAL", ALICE, "hi"))
    assert response.status_code == 404
    assert "SUPERAGENT_SLACK__BOT_TOKEN" in response.json()["error"]["message"]
    assert await pool.fetchval("SELECT count(*) FROM triggers") == 0


async def test_url_verification_answers_the_challenge(
    client: httpx.AsyncClient, pool: asyncpg.Pool
) -> None:
    challenge = "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"
    response = await _post(
        client, {"token": "legacy", "challenge": challenge, "type": "url_verification"}
    )
    assert response.status_code == 200
    assert response.json() == {"challenge": challenge}
    assert await pool.fetchval("SELECT count(*) FROM triggers") == 0


@pytest.mark.usefixtures("allowlist")
async def test_a_mention_is_an_explicit_request_on_its_slack_thread(
    client: httpx.AsyncClient, slack: FakeSlack, pool: asyncpg.Pool
) -> None:
    root = slack.say("C0GENERAL", ALICE, f"<@{BOT_USER}> the deploy is failing, have a look")
    response = await _post(client, root)
    assert response.status_code == 200, response.text
    assert response.json()["trigger"]["verdict"] == "explicit"
    ts = root["event"]["ts"]
    row = await _trigger(pool, root["event_id"])
    assert row["thread_external_id"] == f"C0GENERAL:{ts}"
    assert row["thread_title"] == f"<@{BOT_USER}> the deploy is failing, have a look"
    assert (row["actor_id"], row["actor_name"], row["actor_is_bot"]) == (ALICE_ID, "alice", False)
    assert (row["kind"], row["verdict"], row["route"]) == ("app_mention", "explicit", "router")
    stored = await pool.fetchval("SELECT data FROM blobs WHERE id = $1", row["payload_blob_id"])
    assert "legacy-verification-token" not in bytes(stored).decode()  # no secrets kept
    ack = await pool.fetchrow("SELECT payload FROM effects WHERE kind = $1", EffectKind.ACKNOWLEDGE)
    assert ack is not None
    payload = ack["payload"]
    assert (json.loads(payload) if isinstance(payload, str) else payload)[
        "message_ref"
    ] == f"C0GENERAL:{ts}"

    # A mention inside the thread lands on the same thread; a stranger's is not explicit.
    follow_up = slack.say("C0GENERAL", ALICE, f"<@{BOT_USER}> any news?", thread_ts=ts)
    stranger = slack.say("C0GENERAL", MALLORY, f"<@{BOT_USER}> deploy prod", thread_ts=ts)
    assert (await _post(client, follow_up)).status_code == 200
    assert (await _post(client, stranger)).json()["trigger"]["verdict"] == "ignored"
    assert (await _trigger(pool, follow_up["event_id"]))["thread_id"] == row["thread_id"]
    assert (await _trigger(pool, stranger["event_id"]))["thread_id"] == row["thread_id"]


@pytest.mark.usefixtures("allowlist")
async def test_a_direct_message_addresses_the_agent(
    client: httpx.AsyncClient, slack: FakeSlack, pool: asyncpg.Pool
) -> None:
    dm = slack.say("D0ALICE", ALICE, "can you rerun the nightly build?", event_type="message")
    response = await _post(client, dm)
    assert response.status_code == 200, response.text
    row = await _trigger(pool, dm["event_id"])
    assert (row["kind"], row["verdict"]) == ("message.im", "explicit")
    assert row["thread_external_id"] == f"D0ALICE:{dm['event']['ts']}"
    # In a channel, a message that does not mention the agent is information, not a request.
    chatter = slack.say("C0GENERAL", ALICE, "lunch?", event_type="message")
    assert (await _post(client, chatter)).json()["trigger"]["verdict"] == "ignored"
    assert (await _trigger(pool, chatter["event_id"]))["kind"] == "message.channels"


async def test_a_user_group_on_the_allowlist_makes_its_members_explicit(
    client: httpx.AsyncClient,
    slack: FakeSlack,
    pool: asyncpg.Pool,
    db: async_sessionmaker[AsyncSession],
) -> None:
    slack.add_usergroup("S0DEVS", "devs", [BOB])
    await save_policy(db, Admission(sources={"slack": SourceAdmission(groups=["S0DEVS"])}))
    bob = slack.say("C0GENERAL", BOB, f"<@{BOT_USER}> bump the version")
    alice = slack.say("C0GENERAL", ALICE, f"<@{BOT_USER}> bump it too")
    assert (await _post(client, bob)).json()["trigger"]["verdict"] == "explicit"
    assert (await _post(client, alice)).json()["trigger"]["verdict"] == "ignored"


@pytest.mark.usefixtures("allowlist")
async def test_a_retry_of_a_recorded_event_is_answered_from_the_record(
    client: httpx.AsyncClient,
    slack: FakeSlack,
    pool: asyncpg.Pool,
) -> None:
    event = slack.say("C0GENERAL", ALICE, f"<@{BOT_USER}> ping")
    first = await _post(client, event)
    assert first.status_code == 200
    # The retry reaches another replica (a fresh adapter, nothing cached): it answers from
    # the database without asking Slack anything, and records nothing new.
    other = SlackAdapter(_settings(slack), Intake(pool))
    calls = len(slack.calls)
    retry = {"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"}
    async with _client(pool, other, other.settings) as replica:
        again = await _post(replica, event, headers=retry)
    await other.close()
    assert again.status_code == 200
    assert again.json()["trigger"]["id"] == first.json()["trigger"]["id"]
    assert again.json()["trigger"]["duplicate"] is True
    assert len(slack.calls) == calls
    assert await pool.fetchval("SELECT count(*) FROM triggers") == 1
    assert (
        await pool.fetchval("SELECT count(*) FROM effects WHERE kind = $1", EffectKind.ACKNOWLEDGE)
        == 1
    )


@pytest.mark.usefixtures("allowlist")
async def test_own_messages_edits_and_second_deliveries_make_no_triggers(
    client: httpx.AsyncClient, slack: FakeSlack, pool: asyncpg.Pool
) -> None:
    ours = slack.say("C0GENERAL", BOT_USER, "done: the build is green", bot_id=BOT_ID)
    ours["event"]["type"] = "message"
    ours["event"]["channel_type"] = "channel"
    edited = slack.say("C0GENERAL", ALICE, "typo", event_type="message")
    edited["event"]["subtype"] = "message_changed"
    joined = slack.say("C0GENERAL", ALICE, "has joined", event_type="message")
    joined["event"]["subtype"] = "channel_join"
    # Subscribed to both app_mention and message.channels, Slack delivers a mention twice
    # with two event ids; only the app_mention counts.
    mention = slack.say("C0GENERAL", ALICE, f"<@{BOT_USER}> hi")
    as_message = slack.callback({**mention["event"], "type": "message", "channel_type": "channel"})
    # And a DM arrives as message.im; an app_mention of it (if any) does not count.
    dm = slack.say("D0ALICE", ALICE, f"<@{BOT_USER}> hi", event_type="message")
    dm_mention = slack.callback({**dm["event"], "type": "app_mention"})
    answers = [
        await _post(client, body)
        for body in (ours, edited, joined, as_message, mention, dm_mention, dm)
    ]
    assert [a.status_code for a in answers] == [200] * 7
    ignored = [a.json().get("ignored", "") for a in answers]
    assert "own message" in ignored[0]
    assert "subtype" in ignored[1]
    assert "subtype" in ignored[2]
    assert "app_mention" in ignored[3]
    assert "message.im" in ignored[5]
    kinds = await pool.fetch("SELECT kind FROM triggers ORDER BY created_at")
    assert [r["kind"] for r in kinds] == ["app_mention", "message.im"]


@pytest.mark.usefixtures("allowlist")
async def test_bots_never_make_requests(
    client: httpx.AsyncClient, slack: FakeSlack, pool: asyncpg.Pool
) -> None:
    slack.add_user("U0CIBOT", "ci-bot", is_bot=True)
    root = slack.say("C0GENERAL", ALICE, f"<@{BOT_USER}> watch CI")
    ts = root["event"]["ts"]
    ci = slack.say("C0GENERAL", "U0CIBOT", f"<@{BOT_USER}> build failed", thread_ts=ts)
    ci["event"]["bot_id"] = "B0CI"
    integration = slack.callback(
        {
            "type": "message",
            "subtype": "bot_message",
            "bot_id": "B0HOOK",
            "username": "deploy-hook",
            "text": "deployed v2",
            "ts": ts.split(".")[0] + ".999999",
            "thread_ts": ts,
            "channel": "C0GENERAL",
            "channel_type": "channel",
        }
    )
    for body in (root, ci, integration):
        assert (await _post(client, body)).status_code == 200
    rows = await pool.fetch(
        "SELECT actor_id, actor_name, actor_is_bot, verdict FROM triggers "
        "WHERE actor_is_bot ORDER BY actor_id"
    )
    assert [(r["actor_id"], r["actor_name"], r["verdict"]) for r in rows] == [
        (f"{TEAM_ID}/B0HOOK", "deploy-hook", "ignored"),
        (f"{TEAM_ID}/U0CIBOT", "ci-bot", "ignored"),
    ]
    assert (
        await pool.fetchval("SELECT count(*) FROM effects WHERE kind = $1", EffectKind.ACKNOWLEDGE)
        == 1
    )


# ------------------------------------------------------------------------ outbound


def _reply(thread_id: str, thread_external_id: str, text: str, attempt: int = 1) -> ClaimedEffect:
    reply_id = new_id("msg")
    return ClaimedEffect(
        id=new_id("eff"),
        kind="reply",
        key=reply_id,
        payload={
            "reply_id": reply_id,
            "thread_id": thread_id,
            "source": "slack",
            "thread_external_id": thread_external_id,
            "text": text,
        },
        generation=1,
        attempt=attempt,
    )


def _again(effect: ClaimedEffect) -> ClaimedEffect:
    return ClaimedEffect(
        effect.id, effect.kind, effect.key, effect.payload, effect.generation, effect.attempt + 1
    )


async def _thread_of(
    client: httpx.AsyncClient, slack: FakeSlack, pool: asyncpg.Pool
) -> tuple[str, str, str]:
    """(thread id, thread external id, root ts) of a new mention in #general."""
    root = slack.say("C0GENERAL", ALICE, f"<@{BOT_USER}> what broke?")
    answer = await _post(client, root)
    assert answer.status_code == 200, answer.text
    ts = root["event"]["ts"]
    return answer.json()["trigger"]["thread"], f"C0GENERAL:{ts}", ts


async def test_a_reply_lands_in_its_thread_marked_with_its_reply_id(
    client: httpx.AsyncClient, slack: FakeSlack, pool: asyncpg.Pool, adapter: SlackAdapter
) -> None:
    thread_id, external, ts = await _thread_of(client, slack, pool)
    send = reply_handler(pool, Channels([adapter]))
    effect = _reply(thread_id, external, "Fixed in <main> & pushed; see @here " + "word " * 150)
    await send(effect)
    replies = [m for m in slack.thread("C0GENERAL", ts) if m.get("bot_id") == BOT_ID]
    assert len(replies) == 1
    reply = replies[0]
    assert reply["thread_ts"] == ts
    assert reply["metadata"] == {
        "event_type": "superagent_reply",
        "event_payload": {"reply_id": effect.payload["reply_id"]},
    }
    assert reply["text"].startswith("Fixed in &lt;main&gt; &amp; pushed")
    assert len(reply["text"].split()) <= 101  # clipped by the outbox: 100 words and "…"
    sent = await pool.fetchrow("SELECT * FROM sent_messages")
    assert sent is not None
    assert sent["external_id"] == f"C0GENERAL:{reply['ts']}"


async def test_a_retried_send_does_not_post_twice(
    client: httpx.AsyncClient, slack: FakeSlack, pool: asyncpg.Pool, adapter: SlackAdapter
) -> None:
    thread_id, external, ts = await _thread_of(client, slack, pool)
    for i in range(5):  # a longer thread, read a page at a time
        slack.say("C0GENERAL", BOB, f"me too {i}", event_type="message", thread_ts=ts)
    slack.page_size_cap = 2
    send = reply_handler(pool, Channels([adapter]))
    effect = _reply(thread_id, external, "on it")
    # The first attempt posts, but its answer is lost on the way back.
    slack.fail_next("chat.postMessage", Failure(status=502, after_effect=True))
    with pytest.raises(TransientError):
        await send(effect)
    await send(_again(effect))
    ours = [m for m in slack.thread("C0GENERAL", ts) if m.get("bot_id") == BOT_ID]
    assert [m["text"] for m in ours] == ["on it"]
    assert len(slack.calls_to("chat.postMessage")) == 1
    assert len(slack.calls_to("conversations.replies")) == 4  # 7 messages, 2 a page
    posted = await pool.fetchval("SELECT external_id FROM sent_messages")
    assert posted == f"C0GENERAL:{ours[0]['ts']}"


async def test_rate_limits_postpone_and_channel_errors_say_what_to_fix(
    client: httpx.AsyncClient, slack: FakeSlack, pool: asyncpg.Pool, adapter: SlackAdapter
) -> None:
    thread_id, external, _ts = await _thread_of(client, slack, pool)
    send = reply_handler(pool, Channels([adapter]))
    slack.fail_next("chat.postMessage", Failure(status=429, retry_after=7))
    with pytest.raises(Postpone) as postponed:
        await send(_reply(thread_id, external, "hello"))
    assert postponed.value.seconds == 7
    slack.channels["C0GENERAL"].bot_member = False
    with pytest.raises(Permanent, match="invite"):
        await send(_reply(thread_id, external, "hello"))
    slack.channels["C0GENERAL"].bot_member = True
    slack.fail_next("chat.postMessage", Failure(error="missing_scope", extra={"needed": "x:y"}))
    with pytest.raises(Permanent, match="x:y"):
        await send(_reply(thread_id, external, "hello"))
    revoked = SlackAdapter(_settings(slack, bot_token=SecretStr("xoxb-revoked")), Intake(pool))
    try:
        with pytest.raises(Permanent, match="SUPERAGENT_SLACK__BOT_TOKEN") as refused:
            await reply_handler(pool, Channels([revoked]))(_reply(thread_id, external, "x"))
        assert "xoxb-revoked" not in str(refused.value)
    finally:
        await revoked.close()
    slack.fail_next("chat.postMessage", Failure(status=503))
    with pytest.raises(TransientError):
        await send(_reply(thread_id, external, "hello"))
    assert await pool.fetchval("SELECT count(*) FROM sent_messages") == 0


@pytest.mark.usefixtures("allowlist")
async def test_an_accepted_request_gets_eyes_through_the_outbox(
    client: httpx.AsyncClient,
    slack: FakeSlack,
    pool: asyncpg.Pool,
    adapter: SlackAdapter,
    database_url: str,
) -> None:
    request = slack.say("C0GENERAL", ALICE, f"<@{BOT_USER}> look at #42")
    ignored = slack.say("C0GENERAL", MALLORY, f"<@{BOT_USER}> look at #43")
    for body in (request, ignored):
        assert (await _post(client, body)).status_code == 200
    handlers = Handlers()
    handlers.register(EffectKind.ACKNOWLEDGE, acknowledge_handler(pool, Channels([adapter])))
    runner = EffectRunner(asyncpg_dsn(database_url), handlers, EffectsSettings(), owner="t")
    await runner.start()
    try:
        await assert_eventually(
            lambda: _no_pending_acks(pool), message="the acknowledgement is done"
        )
    finally:
        await runner.stop()
    (message,) = [m for m in slack.thread("C0GENERAL", request["event"]["ts"])]
    assert message["reactions"] == [{"name": "eyes", "users": [BOT_USER], "count": 1}]
    (other,) = slack.thread("C0GENERAL", ignored["event"]["ts"])
    assert "reactions" not in other
    # Reacting again (a retry after a lost answer) is a success, not an error.
    ack = acknowledge_handler(pool, Channels([adapter]))
    await ack(
        ClaimedEffect(
            "eff_x",
            EffectKind.ACKNOWLEDGE,
            "k",
            {
                "trigger_id": "trg_x",
                "source": "slack",
                "thread_external_id": f"C0GENERAL:{request['event']['ts']}",
                "message_ref": f"C0GENERAL:{request['event']['ts']}",
            },
            1,
            2,
        )
    )
    assert slack.calls_to("reactions.add")[-1].args["name"] == "eyes"


async def _no_pending_acks(pool: asyncpg.Pool) -> bool:
    count = await pool.fetchval(
        "SELECT count(*) FROM effects WHERE kind = $1", EffectKind.ACKNOWLEDGE
    )
    return bool(count == 0)
