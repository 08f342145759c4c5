"""Feishu/Lark: verified callbacks and long-connection events become Triggers; replies and
seen marks reach Lark (a fake speaking its HTTP API and its websocket frame protocol)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import httpx
import pytest
from pydantic import SecretStr, ValidationError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.api.app import create_app
from controlplane.channels.base import Channels, OutboundMessage
from controlplane.channels.lark import events
from controlplane.channels.lark.adapter import LarkAdapter
from controlplane.channels.lark.receiver import LongConnection
from controlplane.channels.outbound import acknowledge_handler, reply_handler
from controlplane.domain import EffectKind
from controlplane.effects.handlers import ClaimedEffect, Permanent, Postpone
from controlplane.errors import TransientError
from controlplane.ingest.admission import Admission, SourceAdmission
from controlplane.ingest.intake import Intake
from controlplane.settings import LarkSettings, Settings
from controlplane.web.state import AppState
from tests.fakes.lark_server import (
    APP_ID,
    APP_SECRET,
    BOT_NAME,
    BOT_OPEN_ID,
    FakeLark,
    encrypt,
    sign,
)
from tests.support.helpers import assert_eventually, save_policy

TOKEN = "verification-token-2718"
KEY = "encrypt-key-1618"
ALICE = "ou_alice000000000000000000000000000"
BOB = "ou_bob00000000000000000000000000000"
CHAT = "oc_team00000000000000000000000000000"
DM = "oc_dm0000000000000000000000000000000"


@pytest.fixture
def fake() -> Iterator[FakeLark]:
    with FakeLark() as server:
        server.users = {ALICE: "Alice", BOB: "Bob"}
        yield server


@pytest.fixture
async def allow_alice(db: async_sessionmaker[AsyncSession]) -> None:
    await save_policy(db, Admission(sources={"lark": SourceAdmission(users=[ALICE])}))


def _settings(fake: FakeLark, *, key: str | None = KEY, **more: Any) -> LarkSettings:
    return LarkSettings(
        app_id=APP_ID,
        app_secret=SecretStr(APP_SECRET),
        verification_token=SecretStr(TOKEN),
        encrypt_key=SecretStr(key) if key else None,
        domain=fake.url,
        **more,
    )


@pytest.fixture
async def adapter(fake: FakeLark, pool: asyncpg.Pool) -> AsyncIterator[LarkAdapter]:
    made = LarkAdapter(_settings(fake), Intake(pool))
    yield made
    await made.close()


def _client(pool: asyncpg.Pool, adapter: LarkAdapter | None) -> httpx.AsyncClient:
    state = AppState(
        settings=Settings(),
        replica_id="test",
        intake=Intake(pool),
        pool=pool,
        channels=Channels([adapter] if adapter else []),
    )
    transport = httpx.ASGITransport(app=create_app(state), raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://test")


def message(
    *,
    event_id: str = "ev-1",
    text: str = "@_user_1 please fix the flaky build",
    chat_id: str = CHAT,
    chat_type: str = "group",
    sender: str = ALICE,
    sender_type: str = "user",
    message_id: str = "om_1",
    root_id: str = "",
    mentions: list[tuple[str, str]] | None = None,
    token: str = TOKEN,
) -> dict[str, Any]:
    """An ``im.message.receive_v1`` event, schema 2.0, as Lark documents it."""
    mentioned = [(BOT_OPEN_ID, BOT_NAME)] if mentions is None else mentions
    return {
        "schema": "2.0",
        "header": {
            "event_id": event_id,
            "token": token,
            "create_time": "1700000000000",
            "event_type": "im.message.receive_v1",
            "tenant_key": "736588c9260f175d",
            "app_id": APP_ID,
        },
        "event": {
            "sender": {
                "sender_id": {"union_id": "on_x", "user_id": "", "open_id": sender},
                "sender_type": sender_type,
                "tenant_key": "736588c9260f175d",
            },
            "message": {
                "message_id": message_id,
                "root_id": root_id,
                "parent_id": root_id,
                "create_time": "1700000000000",
                "update_time": "1700000000000",
                "chat_id": chat_id,
                "chat_type": chat_type,
                "message_type": "text",
                "content": json.dumps({"text": text}),
                "mentions": [
                    {
                        "key": f"@_user_{n}",
                        "id": {"union_id": "on_y", "user_id": "", "open_id": open_id},
                        "name": name,
                        "tenant_key": "736588c9260f175d",
                    }
                    for n, (open_id, name) in enumerate(mentioned, start=1)
                ],
                "user_agent": "Mozilla/5.0",
            },
        },
    }


def _object(value: Any) -> dict[str, Any]:
    """A jsonb column, however the pool decodes it."""
    decoded = json.loads(value) if isinstance(value, str) else value
    assert isinstance(decoded, dict)
    return decoded


async def deliver(
    client: httpx.AsyncClient,
    payload: Any,
    *,
    key: str | None = KEY,
    signed: bool = True,
    raw: bytes | None = None,
    signing_key: str | None = None,
) -> httpx.Response:
    """POST the callback as Lark does: encrypted and signed when there is an encrypt key."""
    if raw is not None:
        body = raw
    elif key:
        body = json.dumps({"encrypt": encrypt(key, json.dumps(payload).encode())}).encode()
    else:
        body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json; charset=utf-8"}
    if signed and (signing_key or key):
        headers.update(sign(signing_key or key or "", body))
    return await client.post("/webhooks/lark", content=body, headers=headers)


async def test_a_signed_encrypted_mention_is_an_explicit_request_recorded_once(
    pool: asyncpg.Pool, adapter: LarkAdapter, fake: FakeLark, allow_alice: None
) -> None:
    async with _client(pool, adapter) as client:
        first = await deliver(client, message())
        again = await deliver(client, message())  # Lark's redelivery: same event_id
    assert first.status_code == 200, first.text
    made = first.json()["trigger"]
    assert (made["verdict"], made["route"], made["duplicate"]) == ("explicit", "router", False)
    assert again.json()["trigger"]["id"] == made["id"]
    assert again.json()["trigger"]["duplicate"] is True
    row = await pool.fetchrow(
        "SELECT t.actor_id, t.actor_name, t.text, t.kind, th.external_id, b.data "
        "FROM triggers t JOIN threads th ON th.id = t.thread_id "
        "JOIN blobs b ON b.id = t.payload_blob_id"
    )
    assert row is not None
    assert (row["actor_id"], row["actor_name"], row["kind"]) == (ALICE, "Alice", "message")
    assert row["text"] == f"@{BOT_NAME} please fix the flaky build"
    assert row["external_id"] == f"{CHAT}:om_1"
    stored = json.loads(row["data"])
    assert stored["event"]["message"]["message_id"] == "om_1"
    assert TOKEN not in row["data"].decode()  # the verification token is not kept
    assert await pool.fetchval("SELECT count(*) FROM triggers") == 1
    ack = await pool.fetchval("SELECT payload FROM effects WHERE kind = $1", EffectKind.ACKNOWLEDGE)
    assert _object(ack)["message_ref"] == "om_1"


async def test_url_verification_plain_and_encrypted(pool: asyncpg.Pool, fake: FakeLark) -> None:
    check = {"challenge": "ajls384kdjx98XX", "token": TOKEN, "type": "url_verification"}
    plain_adapter = LarkAdapter(_settings(fake, key=None), Intake(pool))
    encrypted_adapter = LarkAdapter(_settings(fake), Intake(pool))
    try:
        async with _client(pool, plain_adapter) as client:
            plain = await deliver(client, check, key=None)
            wrong = await deliver(client, {**check, "token": "forged"}, key=None)
        async with _client(pool, encrypted_adapter) as client:
            # Lark sends the URL check encrypted but unsigned.
            encrypted = await deliver(client, check, signed=False)
            forged = await deliver(client, {**check, "token": "forged"}, signed=False)
            unsigned_plain = await deliver(client, check, key=None, signed=False)
            unsigned_event = await deliver(client, message(), signed=False)
    finally:
        await plain_adapter.close()
        await encrypted_adapter.close()
    assert (plain.status_code, plain.json()) == (200, {"challenge": check["challenge"]})
    assert (encrypted.status_code, encrypted.json()) == (200, {"challenge": check["challenge"]})
    assert wrong.status_code == forged.status_code == 401
    assert unsigned_plain.status_code == 401
    assert unsigned_event.status_code == 401
    assert "X-Lark-Signature" in unsigned_event.json()["error"]["message"]
    assert await pool.fetchval("SELECT count(*) FROM triggers") == 0


async def test_bad_callbacks_get_clear_errors_and_store_nothing(
    pool: asyncpg.Pool, adapter: LarkAdapter, allow_alice: None
) -> None:
    async with _client(pool, adapter) as client:
        forged = await deliver(client, message(), signing_key="not-the-key")
        assert forged.status_code == 401
        assert "X-Lark-Signature" in forged.json()["error"]["message"]
        wrong_token = await deliver(client, message(token="not-the-token"))
        assert wrong_token.status_code == 401
        assert "verification token" in wrong_token.json()["error"]["message"]
        garbage = json.dumps({"encrypt": "bm90IGNpcGhlcnRleHQgYXQgYWxs"}).encode()
        undecryptable = await deliver(client, None, raw=garbage)
        assert undecryptable.status_code == 400
        assert "decrypted" in undecryptable.json()["error"]["message"]
        not_json = await deliver(client, None, raw=b"{not json")
        assert not_json.status_code == 400
        too_deep = await deliver(client, None, raw=b"[" * 200_000)
        assert too_deep.status_code == 400
        inner = json.dumps({"encrypt": encrypt(KEY, b"<xml/>")}).encode()
        inner_not_json = await deliver(client, None, raw=inner)
        assert inner_not_json.status_code == 400
        broken = message()
        del broken["event"]["message"]["chat_id"]
        malformed = await deliver(client, broken)
        assert malformed.status_code == 400
        assert "chat_id" in malformed.json()["error"]["message"]
        huge = json.dumps({"encrypt": "A" * (2 << 20)}).encode()
        too_large = await deliver(client, None, raw=huge)
        assert too_large.status_code == 413

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(40):
                yield b" " * 65536

        streamed = await client.post("/webhooks/lark", content=chunks())  # no Content-Length
        assert streamed.status_code == 413
    async with _client(pool, None) as unconfigured:
        off = await deliver(unconfigured, message())
        assert off.status_code == 404
        assert "SUPERAGENT_LARK__APP_ID" in off.json()["error"]["message"]
    assert await pool.fetchval("SELECT count(*) FROM triggers") == 0


async def test_a_replayed_signed_callback_is_refused_for_its_age(
    pool: asyncpg.Pool, adapter: LarkAdapter, allow_alice: None
) -> None:
    """An attacker who captured one signed callback (a log, a proxy) sends it again later:
    its signature still matches, so only the signed timestamp's age can refuse it."""
    body = json.dumps({"encrypt": encrypt(KEY, json.dumps(message()).encode())}).encode()
    headers = {"Content-Type": "application/json; charset=utf-8"}
    async with _client(pool, adapter) as client:
        # Ages past the 300 s allowed by a margin no slow machine spends between here and
        # the check (a clock read once, before the loop, let "301 s ahead" age into it).
        for stamp in ("-3600", "-330", "+330", "yesterday", ""):
            # The offsets from now, read at each request; the rest sent as they are.
            offset = stamp.lstrip("+-").isdigit()
            sent_at = str(int(time.time()) + int(stamp)) if offset else stamp
            replayed = await client.post(
                "/webhooks/lark", content=body, headers={**headers, **sign(KEY, body, sent_at)}
            )
            assert replayed.status_code == 401, (sent_at, replayed.text)
            assert "X-Lark-Request-Timestamp" in replayed.json()["error"]["message"]
        assert await pool.fetchval("SELECT count(*) FROM triggers") == 0
        # The same event signed now (Lark's own redelivery is signed anew) goes through.
        now = int(time.time())
        fresh = await client.post(
            "/webhooks/lark", content=body, headers={**headers, **sign(KEY, body, str(now))}
        )
    assert fresh.status_code == 200, fresh.text
    assert await pool.fetchval("SELECT count(*) FROM triggers") == 1


async def test_who_is_addressed_and_what_they_wrote(
    pool: asyncpg.Pool, adapter: LarkAdapter, fake: FakeLark, allow_alice: None
) -> None:
    async with _client(pool, adapter) as client:
        # A group message for Bob, not the bot: recorded, but not a request to the agent.
        for_bob = await deliver(
            client,
            message(
                event_id="ev-bob",
                message_id="om_2",
                text="@_user_1 and @_user_2, can you look at this?",
                mentions=[(BOB, "Bob"), ("ou_carol", "Carol")],
            ),
        )
        # A reply in the first message's thread, addressing the bot: same thread.
        in_thread = await deliver(
            client, message(event_id="ev-3", message_id="om_3", root_id="om_2")
        )
        # A one-to-one chat needs no mention.
        direct = await deliver(
            client,
            message(event_id="ev-dm", chat_id=DM, chat_type="p2p", text="hi", mentions=[]),
        )
        # The bot's own messages (sent by an app) never become requests.
        own = await deliver(
            client, message(event_id="ev-own", sender=BOT_OPEN_ID, sender_type="app")
        )
    assert for_bob.status_code == in_thread.status_code == direct.status_code == 200
    assert for_bob.json()["trigger"]["verdict"] != "explicit"
    assert in_thread.json()["trigger"]["verdict"] == "explicit"
    assert in_thread.json()["trigger"]["thread"] == for_bob.json()["trigger"]["thread"]
    assert direct.json()["trigger"]["verdict"] == "explicit"
    assert own.status_code == 200
    assert "ignored" in own.json()
    text = await pool.fetchval("SELECT text FROM triggers WHERE external_id = 'ev-bob'")
    assert text == "@Bob and @Carol, can you look at this?"
    threads = await pool.fetch("SELECT external_id, title FROM threads ORDER BY external_id")
    assert [(t["external_id"], t["title"]) for t in threads] == [
        (f"{DM}:om_1", "hi"),
        (f"{CHAT}:om_2", "@Bob and @Carol, can you look at this?"),
    ]
    assert await pool.fetchval("SELECT count(*) FROM triggers") == 3
    assert len(fake.api_calls("/bot/v3/info")) == 1  # the bot's identity is asked once


async def _thread_of_a_request(pool: asyncpg.Pool, adapter: LarkAdapter) -> tuple[str, str]:
    async with _client(pool, adapter) as client:
        response = await deliver(client, message(message_id="om_root"))
    assert response.status_code == 200, response.text
    return response.json()["trigger"]["thread"], f"{CHAT}:om_root"


def _reply(reply_id: str, thread: tuple[str, str], attempt: int = 1) -> ClaimedEffect:
    payload = {
        "reply_id": reply_id,
        "thread_id": thread[0],
        "source": "lark",
        "thread_external_id": thread[1],
        "text": "On it: the build fails on a missing fixture.",
    }
    return ClaimedEffect(f"eff_{reply_id}", EffectKind.REPLY, reply_id, payload, 1, attempt)


async def test_replies_go_out_in_thread_once_per_reply_id(
    pool: asyncpg.Pool, adapter: LarkAdapter, fake: FakeLark, allow_alice: None
) -> None:
    thread = await _thread_of_a_request(pool, adapter)
    send = reply_handler(pool, Channels([adapter]))
    await send(_reply("msg_aaaaaaaaaaaa", thread))
    assert len(fake.replies) == 1
    sent = fake.replies[0]
    assert sent["to"] == "om_root"
    assert sent["body"] == {
        "msg_type": "text",
        "content": json.dumps({"text": "On it: the build fails on a missing fixture."}),
        "reply_in_thread": True,
        "uuid": "msg_aaaaaaaaaaaa",
    }
    recorded = await pool.fetchval(
        "SELECT external_id FROM sent_messages WHERE reply_id = 'msg_aaaaaaaaaaaa'"
    )
    assert recorded == sent["message_id"]
    # A retry whose first attempt posted but was not recorded: Lark's uuid dedupes it.
    again = await adapter.send(
        OutboundMessage("msg_aaaaaaaaaaaa", thread[0], thread[1], "same again", first_try=False)
    )
    assert again == sent["message_id"]
    assert len(fake.replies) == 1


async def test_the_access_token_is_cached_and_refreshed(pool: asyncpg.Pool, fake: FakeLark) -> None:
    thread = ("thr_x", f"{CHAT}:om_root")
    cached = LarkAdapter(_settings(fake), Intake(pool))
    try:
        for n in range(3):
            await cached.send(OutboundMessage(f"msg_{n}", *thread, "hello"))
        assert fake.token_requests == 1
        tokens = {call.token for call in fake.api_calls("/reply")}
        assert len(tokens) == 1
        fake.revoke_tokens()  # Lark answers 99991663: fetch a new one and try once more
        await cached.send(OutboundMessage("msg_3", *thread, "hello"))
        assert fake.token_requests == 2
        assert len(fake.replies) == 4
    finally:
        await cached.close()
    # A token Lark issues for 300 s is due for replacement at once (5 minutes' margin).
    fake.token_expire = 300
    short = LarkAdapter(_settings(fake), Intake(pool))
    try:
        await short.send(OutboundMessage("msg_4", *thread, "hello"))
        await short.send(OutboundMessage("msg_5", *thread, "hello"))
    finally:
        await short.close()
    assert fake.token_requests == 4


async def test_an_accepted_request_is_marked_seen(
    pool: asyncpg.Pool, adapter: LarkAdapter, fake: FakeLark, allow_alice: None
) -> None:
    await _thread_of_a_request(pool, adapter)
    row = await pool.fetchrow(
        "SELECT id, key, payload FROM effects WHERE kind = $1", EffectKind.ACKNOWLEDGE
    )
    assert row is not None
    acknowledge = acknowledge_handler(pool, Channels([adapter]))
    await acknowledge(
        ClaimedEffect(row["id"], EffectKind.ACKNOWLEDGE, row["key"], _object(row["payload"]), 1, 1)
    )
    assert fake.reactions == [
        {"message_id": "om_root", "body": {"reaction_type": {"emoji_type": "OnIt"}}}
    ]


async def test_lark_errors_become_waits_parks_or_retries(
    pool: asyncpg.Pool, adapter: LarkAdapter, fake: FakeLark, allow_alice: None
) -> None:
    thread = await _thread_of_a_request(pool, adapter)
    send = reply_handler(pool, Channels([adapter]))
    fake.fail_next("/reply", status=429, code=99991400, headers={"x-ogw-ratelimit-reset": "7"})
    with pytest.raises(Postpone) as waited:
        await send(_reply("msg_limited00000", thread))
    assert waited.value.seconds == 7
    fake.fail_next("/reply", status=400, code=230002, msg="Bot is not in the chat")
    with pytest.raises(Permanent, match="not in this chat"):
        await send(_reply("msg_notinchat000", thread))
    fake.fail_next("/reply", status=503, code=1, msg="system busy")
    with pytest.raises(TransientError):
        await send(_reply("msg_busy00000000", thread))
    await send(_reply("msg_busy00000000", thread, attempt=2))
    assert [r["body"]["uuid"] for r in fake.replies] == ["msg_busy00000000"]
    assert await pool.fetchval("SELECT count(*) FROM sent_messages") == 1


async def _answer(fake: FakeLark, event: dict[str, Any]) -> dict[str, Any]:
    """Push ``event`` over the long connection; the client's answer to it."""
    return await asyncio.wait_for(asyncio.wrap_future(fake.push_event(event)), 10)


async def test_events_over_the_long_connection_are_ingested(
    pool: asyncpg.Pool, fake: FakeLark, allow_alice: None
) -> None:
    adapter = LarkAdapter(_settings(fake, long_connection=True), Intake(pool))
    [service] = adapter.services()
    assert isinstance(service, LongConnection)
    await service.start()
    try:
        await assert_eventually(lambda: fake.ws_connected, message="the client connects")
        event = message(
            event_id="ev-ws", chat_id=DM, chat_type="p2p", text="deploy it", mentions=[]
        )
        answer = await _answer(fake, event)
        assert answer["code"] == 200
        row = await pool.fetchrow("SELECT verdict, text, actor_name FROM triggers")
        assert row is not None
        assert (row["verdict"], row["text"], row["actor_name"]) == (
            "explicit",
            "deploy it",
            "Alice",
        )
        broken = message(event_id="ev-broken")
        del broken["event"]["message"]["message_id"]
        dropped = await _answer(fake, broken)
        assert dropped["code"] == 200  # acknowledged and dropped: redelivery would not help
        # Lark drops the connection: the SDK reconnects, events flow again.
        fake.drop_connection()
        await assert_eventually(lambda: fake.ws_connections == 2 and fake.ws_connected)
        again = message(event_id="ev-ws-2", chat_id=DM, chat_type="p2p", text="and", mentions=[])
        assert (await _answer(fake, again))["code"] == 200
        assert await pool.fetchval("SELECT count(*) FROM triggers") == 2
    finally:
        await service.stop()
        await adapter.close()
    assert service.task.done()
    assert service.task.exception() is None
    await assert_eventually(lambda: not fake.ws_connected, message="the socket is closed")


async def test_senders_are_named_by_open_id_without_the_contact_scope(
    pool: asyncpg.Pool, adapter: LarkAdapter, fake: FakeLark, allow_alice: None
) -> None:
    fake.contact_scope = False
    async with _client(pool, adapter) as client:
        for n in range(2):
            response = await deliver(client, message(event_id=f"ev-{n}", message_id=f"om_{n}"))
            assert response.json()["trigger"]["verdict"] == "explicit"  # allowlisted by id
    names = await pool.fetch("SELECT actor_name FROM triggers")
    assert [row["actor_name"] for row in names] == [ALICE, ALICE]
    assert len(fake.api_calls("/contact/v3/users/")) == 1  # not asked again


def test_rich_text_posts_read_as_plain_text() -> None:
    post = {
        "title": "Release",
        "content": [
            [
                {"tag": "at", "user_id": "@_user_1", "user_name": BOT_NAME},
                {"tag": "text", "text": " ship "},
            ],
            [
                {"tag": "a", "text": "the notes", "href": "https://x"},
                {"tag": "img", "image_key": "k"},
            ],
        ],
    }
    event = message(text="")
    event["event"]["message"].update(message_type="post", content=json.dumps(post))
    parsed = events.parse(event)
    assert isinstance(parsed, events.Message)
    assert events.text_of(parsed) == f"Release\n@{BOT_NAME} ship \nthe notes[img]"


def test_half_a_configuration_is_refused_at_startup() -> None:
    with pytest.raises(ValidationError, match="app_id and app_secret together"):
        LarkSettings(app_id=APP_ID)
    with pytest.raises(ValidationError, match="need the app's app_id"):
        LarkSettings(verification_token=SecretStr(TOKEN))
    with pytest.raises(ValidationError, match="not an http"):
        LarkSettings(app_id=APP_ID, app_secret=SecretStr(APP_SECRET), domain="open.feishu.cn")
