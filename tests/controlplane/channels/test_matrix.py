"""Matrix: a bot in rooms, threads and mentions, end to end against a real Synapse.

The homeserver is started by the test suite on loopback (tests/support/synapse.py); alice and bob
are real users talking over the client-server API, and the bot is the adapter under test,
its sync loop running as a Service against the test database.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from nio import ErrorResponse
from pydantic import SecretStr, ValidationError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.channels.base import (
    Acknowledgement,
    ChannelError,
    Channels,
    OutboundMessage,
    RateLimited,
)
from controlplane.channels.context import ChannelContext
from controlplane.channels.matrix import build_adapter
from controlplane.channels.matrix.adapter import REPLY_ID_KEY, SEEN, MatrixAdapter
from controlplane.channels.matrix.client import error_for
from controlplane.channels.matrix.events import (
    BotIdentity,
    parse_message,
    parse_thread,
    since_invited,
    thread_external_id,
)
from controlplane.channels.matrix.receiver import MatrixSync
from controlplane.channels.outbound import acknowledge_handler, reply_handler
from controlplane.effects.handlers import ClaimedEffect
from controlplane.errors import TransientError
from controlplane.ingest.admission import Admission, SourceAdmission
from controlplane.ingest.intake import IncomingTrigger, Ingested, Intake
from controlplane.settings import MatrixSettings, Settings
from tests.support.helpers import assert_eventually, save_policy
from tests.support.synapse import Homeserver, MatrixRequestError, MatrixUser, synapse  # noqa: F401

BOT = BotIdentity("@agent:example.org", "Super Agent")
ROOM = "!room:example.org"


def _event(content: dict[str, Any], *, sender: str = "@alice:example.org") -> dict[str, Any]:
    return {
        "type": "m.room.message",
        "event_id": f"${secrets.token_hex(6)}",
        "sender": sender,
        "origin_server_ts": 1,
        "content": content,
    }


# --- events: pure mapping ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "mentioned"),
    [
        ({"body": "hi", "m.mentions": {"user_ids": ["@agent:example.org"]}}, True),
        ({"body": "@agent:example.org look"}, True),
        ({"body": "@agent please look"}, True),
        ({"body": "agent: please look"}, True),
        ({"body": "thanks, super agent!"}, True),
        ({"body": "the agents are busy"}, False),
        ({"body": "re-agent the pipeline"}, False),
        ({"body": "hi", "m.mentions": {"user_ids": ["@bob:example.org"]}}, False),
        (
            {
                "body": "Super Agent: hi",
                "formatted_body": '<a href="https://matrix.to/#/%40agent%3Aexample.org">SA</a>',
            },
            True,
        ),
    ],
)
def test_mentions_of_the_bot(content: dict[str, Any], mentioned: bool) -> None:
    message = parse_message(ROOM, _event({"msgtype": "m.text", **content}), BOT)
    assert message is not None
    assert message.mentions_bot is mentioned


def test_thread_relation_decides_the_root() -> None:
    root = _event({"msgtype": "m.text", "body": "first"})
    reply = _event(
        {
            "msgtype": "m.text",
            "body": "second",
            "m.relates_to": {"rel_type": "m.thread", "event_id": root["event_id"]},
        }
    )
    rich_reply = _event(
        {
            "msgtype": "m.text",
            "body": "> quoted\n\nthird",
            "m.relates_to": {"m.in_reply_to": {"event_id": root["event_id"]}},
        }
    )
    parsed = [parse_message(ROOM, event, BOT) for event in (root, reply, rich_reply)]
    assert [m.root_event_id for m in parsed if m] == [
        root["event_id"],
        root["event_id"],
        rich_reply["event_id"],
    ]
    assert parse_thread(thread_external_id(ROOM, root["event_id"])) == (ROOM, root["event_id"])
    assert parse_thread("acme/app#7") is None


def test_what_is_not_a_request() -> None:
    own = _event({"msgtype": "m.text", "body": "done"}, sender=BOT.user_id)
    edit = _event(
        {
            "msgtype": "m.text",
            "body": "* @agent fixed typo",
            "m.relates_to": {"rel_type": "m.replace", "event_id": "$orig"},
        }
    )
    redacted = {**_event({}), "content": {}}
    reaction = {**_event({}), "type": "m.reaction"}
    assert [parse_message(ROOM, e, BOT) for e in (own, edit, redacted, reaction)] == [None] * 4
    notice = parse_message(ROOM, _event({"msgtype": "m.notice", "body": "CI passed"}), BOT)
    assert notice is not None
    assert notice.is_notice


def test_history_before_the_invitation_is_not_read() -> None:
    def member(membership: str) -> dict[str, Any]:
        return {
            "type": "m.room.member",
            "state_key": BOT.user_id,
            "sender": "@alice:example.org",
            "event_id": f"${membership}",
            "content": {"membership": membership},
        }

    before, between, after = (_event({"body": str(n)}) for n in range(3))
    timeline = [before, member("invite"), between, member("join"), after]
    assert since_invited(timeline, BOT.user_id) == [between, member("join"), after]
    # Joined without an invitation in sight: from the join on.
    assert since_invited([between, member("join"), after], BOT.user_id) == [member("join"), after]
    assert since_invited([before, after], BOT.user_id) == [before, after]
    # The bot renaming itself is not joining again.
    renamed = {**member("join"), "unsigned": {"prev_content": {"membership": "join"}}}
    assert since_invited([before, renamed, after], BOT.user_id) == [before, renamed, after]


def test_homeserver_errors_map_to_channel_errors() -> None:
    limited = error_for(ErrorResponse("Too Many Requests", "M_LIMIT_EXCEEDED", 1500), "reply")
    assert isinstance(limited, RateLimited)
    assert limited.seconds == 1.5
    forbidden = error_for(ErrorResponse("User not in room", "M_FORBIDDEN"), "reply in !r:x")
    assert isinstance(forbidden, ChannelError)
    assert "not in room" in str(forbidden)
    assert isinstance(error_for(ErrorResponse("unknown error"), "sync"), TransientError)
    token = error_for(ErrorResponse("Invalid token", "M_UNKNOWN_TOKEN"), "sync")
    assert isinstance(token, ChannelError)
    assert "SUPERAGENT_MATRIX__ACCESS_TOKEN" in str(token)


def test_settings_say_what_is_missing() -> None:
    with pytest.raises(ValidationError, match="access_token, or password"):
        MatrixSettings(homeserver="https://m.example.org", user_id="@agent:example.org")
    with pytest.raises(ValidationError, match="full Matrix id"):
        MatrixSettings(
            homeserver="https://m.example.org", user_id="agent", password=SecretStr("pw")
        )
    with pytest.raises(ValidationError, match="set homeserver"):
        MatrixSettings(user_id="@agent:example.org")


# --- end to end against Synapse ---------------------------------------------------------


class CountingIntake(Intake):
    """Records every event the sync loop hands over, duplicates included."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        super().__init__(pool)
        self.seen: list[str] = []

    async def ingest(self, trigger: IncomingTrigger) -> Ingested:
        self.seen.append(trigger.external_id)
        return await super().ingest(trigger)


class Bot:
    """The adapter under test and its sync loop, restartable like a leader's service."""

    def __init__(self, adapter: MatrixAdapter, intake: CountingIntake) -> None:
        self.adapter = adapter
        self.intake = intake
        self.sync: MatrixSync | None = None

    async def start(self, **options: Any) -> None:
        if options:
            self.sync = MatrixSync(self.adapter.account, self.intake, self.adapter.pool, **options)
        else:
            (make,) = self.adapter.leader_services()
            made = make()
            assert isinstance(made, MatrixSync)
            self.sync = made
        await self.sync.start()

    async def stop(self) -> None:
        if self.sync is not None:
            await self.sync.stop()
            assert not self.sync.task.cancelled(), "the sync loop should stop when asked"
            assert self.sync.task.exception() is None
            self.sync = None


def _settings(server: Homeserver, bot: MatrixUser) -> MatrixSettings:
    return MatrixSettings(
        homeserver=server.url,
        user_id=bot.user_id,
        password=SecretStr(bot.password),
        sync_timeout_seconds=5.0,
    )


def _settings_for(bot: Bot, **overrides: Any) -> MatrixSettings:
    return bot.adapter.account.settings.model_copy(update=overrides)


@pytest.fixture
async def users(synapse: Homeserver) -> dict[str, MatrixUser]:  # noqa: F811
    suffix = secrets.token_hex(3)
    found = {name: await synapse.register(f"{name}{suffix}") for name in ("alice", "bob", "agent")}
    await found["agent"].call(
        "PUT", f"/profile/{found['agent'].user_id}/displayname", {"displayname": "Super Agent"}
    )
    return found


@pytest.fixture
async def bot(
    synapse: Homeserver,  # noqa: F811
    users: dict[str, MatrixUser],
    pool: asyncpg.Pool,
    db: async_sessionmaker[AsyncSession],
) -> AsyncIterator[Bot]:
    await save_policy(
        db, Admission(sources={"matrix": SourceAdmission(users=[users["alice"].user_id])})
    )
    intake = CountingIntake(pool)
    adapter = MatrixAdapter(_settings(synapse, users["agent"]), intake, pool)
    running = Bot(adapter, intake)
    try:
        yield running
    finally:
        await running.stop()
        await adapter.close()


async def _trigger(pool: asyncpg.Pool, event_id: str) -> asyncpg.Record:
    async def found() -> asyncpg.Record | None:
        return await pool.fetchrow(
            "SELECT t.*, th.external_id AS thread_external_id FROM triggers t "
            "JOIN threads th ON th.id = t.thread_id WHERE t.source = 'matrix' "
            "AND t.external_id = $1",
            event_id,
        )

    row: asyncpg.Record = await assert_eventually(found, message=f"a trigger for {event_id}")
    return row


async def _joined(user: MatrixUser, room_id: str, member: str) -> None:
    async def check() -> bool:
        return member in await user.joined_members(room_id)

    await assert_eventually(check, message=f"{member} joined {room_id}")


async def test_a_threaded_conversation_with_the_agent(
    bot: Bot, users: dict[str, MatrixUser], pool: asyncpg.Pool
) -> None:
    alice, bob, agent = users["alice"], users["bob"], users["agent"]
    room = await alice.create_room(invite=[bob.user_id])
    await bob.join(room)
    before_invite = await alice.say(room, "bob, shall we ask the agent?")
    await bot.start()
    await alice.call("POST", f"/rooms/{room}/invite", {"user_id": agent.user_id})
    await _joined(alice, room, agent.user_id)

    # Alice mentions the bot (as Element does): an explicit request, rooted at her message.
    root = await alice.say(room, "Super Agent: is the deploy healthy?", mentions=[agent.user_id])
    request = await _trigger(pool, root)
    assert request["thread_external_id"] == f"{room}|{root}"
    assert (request["actor_id"], request["actor_name"]) == (alice.user_id, alice.user_id)
    assert request["verdict"] == "explicit", request["verdict_reason"]
    assert request["route"] == "router"
    thread = await pool.fetchrow(
        "SELECT title, url FROM threads WHERE id = $1", request["thread_id"]
    )
    assert thread is not None
    assert thread["title"] == "Ops"
    assert thread["url"].startswith("https://matrix.to/#/%21")

    # Accepted, so ingest queued the 👀 acknowledgement; the outbox hands it to the adapter.
    channels = Channels([bot.adapter])
    ack = await pool.fetchrow(
        "SELECT id, kind, key, payload FROM effects WHERE kind = 'acknowledge' AND key = $1",
        request["id"],
    )
    assert ack is not None
    for attempt in (1, 2):  # a retried acknowledgement adds nothing
        await acknowledge_handler(pool, channels)(
            ClaimedEffect(ack["id"], ack["kind"], ack["key"], ack["payload"], 1, attempt)
        )
    reactions = await bob.relations(room, root, "m.annotation")
    assert [(r["sender"], r["content"]["m.relates_to"]["key"]) for r in reactions] == [
        (agent.user_id, SEEN)
    ]

    # The router's reply goes out through the outbox, as a threaded reply to the root.
    payload = {
        "reply_id": "rpl_matrix1",
        "thread_id": request["thread_id"],
        "source": "matrix",
        "thread_external_id": request["thread_external_id"],
        "text": "Yes: all 3 replicas are healthy. Want me to roll out 1.4?",
    }
    await reply_handler(pool, channels)(
        ClaimedEffect("eff_reply1", "reply", "rpl_matrix1", payload, 1, 1)
    )
    sent_id = await pool.fetchval(
        "SELECT external_id FROM sent_messages WHERE reply_id = 'rpl_matrix1'"
    )
    for reader in (alice, bob):
        in_thread = await reader.relations(room, root, "m.thread")
        assert [event["event_id"] for event in in_thread] == [sent_id]
    reply = await alice.event(room, sent_id)
    assert reply["sender"] == agent.user_id
    assert reply["content"]["body"] == payload["text"]
    assert reply["content"]["m.relates_to"] == {
        "rel_type": "m.thread",
        "event_id": root,
        "is_falling_back": True,
        "m.in_reply_to": {"event_id": root},
    }

    # Retries post nothing new: the same transaction id on the same device...
    again = OutboundMessage("rpl_matrix1", request["thread_id"], f"{room}|{root}", "x", True)
    assert await bot.adapter.send(again) == sent_id
    # ...and, from another device (no transaction in common), the reply id in the content.
    other = MatrixAdapter(_settings_for(bot, device_id="OTHERDEVICE"), bot.intake, pool)
    try:
        retried = OutboundMessage("rpl_matrix1", request["thread_id"], f"{room}|{root}", "x", False)
        assert await other.send(retried) == sent_id
        # A 👀 the homeserver already has (its transaction forgotten) is not an error.
        await other.acknowledge(Acknowledgement(request["id"], f"{room}|{root}", root))
    finally:
        await other.close()
    assert len(await alice.relations(room, root, "m.thread")) == 1
    assert len(await alice.relations(room, root, "m.annotation")) == 1
    assert reply["content"][REPLY_ID_KEY] == "rpl_matrix1"

    # Bob answers in the thread: a Trigger on the same thread (bob is not allowlisted).
    answer = await bob.say(room, "I'd wait for the 1.4 notes", thread_root=root)
    bobs = await _trigger(pool, answer)
    assert bobs["thread_id"] == request["thread_id"]
    assert (bobs["actor_id"], bobs["verdict"]) == (bob.user_id, "ignored")

    # Not addressed in a room of three: stored, not a request.
    chatter = await alice.say(room, "lunch anyone?")
    assert (await _trigger(pool, chatter))["verdict"] == "ignored"

    # What was said before the bot was invited is not read; its own reply is not a trigger.
    assert before_invite not in bot.intake.seen
    assert sent_id not in bot.intake.seen

    # A restart resumes after the last ingested batch: nothing again, nothing missed, even
    # when more happened meanwhile than one sync returns (the gap is read back).
    await bot.stop()
    handed_over = list(bot.intake.seen)
    assert len(handed_over) == len(set(handed_over))
    meanwhile = [
        await alice.say(room, f"@{agent.localpart} and the staging one? ({n})", thread_root=root)
        for n in range(4)
    ]
    await bot.start(timeline_limit=2)
    for event_id in meanwhile:
        assert (await _trigger(pool, event_id))["thread_id"] == request["thread_id"]
    last = await bob.say(room, "done here")
    await _trigger(pool, last)
    assert bot.intake.seen == [*handed_over, *meanwhile, last]
    count = await pool.fetchval("SELECT count(*) FROM triggers WHERE source = 'matrix'")
    assert count == len(bot.intake.seen) == 8


async def test_direct_chats_first_start_and_refusals(
    bot: Bot, users: dict[str, MatrixUser], pool: asyncpg.Pool
) -> None:
    alice, agent = users["alice"], users["agent"]
    # Before the bot's first start: a room it is already in, with an old request.
    old_room = await alice.create_room(invite=[agent.user_id], name="Old")
    await agent.join(old_room)
    old = await alice.say(old_room, "old request", mentions=[agent.user_id])
    # Invited while the bot was not running: the request made since is for it.
    waiting_room = await alice.create_room(invite=[agent.user_id], name="Waiting")
    waiting = await alice.say(waiting_room, "Super Agent, when you are here: check CI")
    dm = await alice.call(
        "POST",
        "/createRoom",
        {"preset": "trusted_private_chat", "is_direct": True, "invite": [agent.user_id]},
    )
    # A short timeline: rooms just joined are read back to the invitation.
    await bot.start(timeline_limit=2)
    await _joined(alice, dm["room_id"], agent.user_id)

    assert (await _trigger(pool, waiting))["verdict"] == "explicit"
    # In a direct chat everything is addressed to the agent, no mention needed.
    hello = await alice.say(dm["room_id"], "can you rotate the staging keys?")
    assert (await _trigger(pool, hello))["verdict"] == "explicit"
    # The first start began from then: the old request was not replayed, new ones are read.
    new = await alice.say(old_room, "new one, Super Agent")
    assert (await _trigger(pool, new))["verdict"] == "explicit"
    assert old not in bot.intake.seen

    # A room the bot is not in: a clear, permanent error, not a retry loop.
    nowhere = OutboundMessage("rpl_x", "thr_x", "!nowhere:localhost|$root", "hi")
    with pytest.raises(ChannelError, match="forbidden"):
        await bot.adapter.send(nowhere)
    with pytest.raises(ChannelError, match="not a Matrix thread"):
        await bot.adapter.send(OutboundMessage("rpl_y", "thr_x", "acme/app#1", "hi"))


async def test_credentials_token_password_and_refusals(
    synapse: Homeserver,  # noqa: F811
    users: dict[str, MatrixUser],
    pool: asyncpg.Pool,
) -> None:
    alice, agent = users["alice"], users["agent"]
    room = await alice.create_room(invite=[agent.user_id])
    await agent.join(room)
    root = await alice.say(room, "hello")
    thread = f"{room}|{root}"

    async def send_with(settings: MatrixSettings, reply_id: str) -> str:
        adapter = build_adapter_for(settings, pool)
        try:
            return await adapter.send(OutboundMessage(reply_id, "thr", thread, "hi"))
        finally:
            await adapter.close()

    by_token = MatrixSettings(
        homeserver=synapse.url, user_id=agent.user_id, access_token=SecretStr(agent.access_token)
    )
    assert (await send_with(by_token, "rpl_token")).startswith("$")

    with pytest.raises(ChannelError, match="rejected the bot's credentials") as refused:
        await send_with(
            by_token.model_copy(update={"access_token": SecretStr("syt_not_a_token")}), "rpl_bad"
        )
    assert "syt_not_a_token" not in str(refused.value)

    by_password = _settings(synapse, agent)
    with pytest.raises(ChannelError, match="SUPERAGENT_MATRIX__PASSWORD") as refused:
        await send_with(
            by_password.model_copy(update={"password": SecretStr("wrong-horse")}), "rpl_pw"
        )
    assert "wrong-horse" not in str(refused.value)

    # Logged in on start; when the homeserver revokes that token, it logs in again.
    adapter = build_adapter_for(by_password, pool)
    try:
        await adapter.send(OutboundMessage("rpl_pw1", "thr", thread, "one"))
        await agent.call("POST", "/logout/all", {})  # every token of the bot, revoked
        await adapter.send(OutboundMessage("rpl_pw2", "thr", thread, "two"))
    finally:
        await adapter.close()
    bodies = [event["content"]["body"] for event in await alice.relations(room, root, "m.thread")]
    assert sorted(bodies) == ["hi", "one", "two"]
    with pytest.raises(MatrixRequestError, match="M_UNKNOWN_TOKEN"):
        await agent.call("GET", "/account/whoami")


def build_adapter_for(settings: MatrixSettings, pool: asyncpg.Pool) -> MatrixAdapter:
    """Through the package's factory, as the registry builds it."""
    ctx = ChannelContext(
        settings=Settings(matrix=settings),
        pool=pool,
        intake=Intake(pool),
        dsn="unused",
        replica_id="test",
    )
    made = build_adapter(ctx)
    assert isinstance(made, MatrixAdapter)
    return made
