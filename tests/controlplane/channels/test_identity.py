"""One person across channels, and the channels' reply style.

* ``superagent users link`` makes a person's accounts one initiator: allowlists may name the
  person, triggers and mandates record them, and "my laptop" is a device they own. Accounts
  are the channels' immutable actor ids, never names
  (tests/controlplane/identities/test_identities.py plays the
  attacker).
* Chat replies are at most 100 words (the router's tool refuses longer; the outbox cuts
  what other writers send); GitHub replies are not cut.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Callable

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane import people
from controlplane.channels.base import ChannelAdapter, Channels, OutboundMessage
from controlplane.channels.outbound import reply_handler
from controlplane.domain import EffectKind
from controlplane.effects.handlers import ClaimedEffect
from controlplane.errors import Conflict
from controlplane.ingest.admission import WEB_CONSOLE_GROUP, Actor, Admission, SourceAdmission
from controlplane.ingest.intake import IncomingTrigger, Ingested, Intake, ThreadRef
from controlplane.router import batch as batches
from controlplane.router.tools.core import Turn
from controlplane.router.tools.toolbox import Toolbox
from superagent_shared.ids import new_id
from tests.support.helpers import save_policy

TURN = Turn(session_id=None, llm_call_id=None, batch=())


def _unique(prefix: str) -> str:
    return f"{prefix}-{new_id('dev')[4:].lower()}"


def _github_id() -> str:
    """A GitHub numeric user id no other test links."""
    return str(10**8 + secrets.randbelow(10**9))


@pytest.fixture
def person() -> str:
    return _unique("dana")


@pytest.fixture
async def intake(pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession], person: str) -> Intake:
    # Allowlists name the person, not the accounts.
    await save_policy(db, Admission(default=SourceAdmission(users=[person])))
    return Intake(pool)


async def _say(
    intake: Intake,
    source: str,
    actor: Actor,
    text: str = "@superagent fix it",
    *,
    direct: bool = False,
    ack_ref: str | None = None,
) -> Ingested:
    external = new_id("trg")
    return await intake.ingest(
        IncomingTrigger(
            source=source,
            external_id=external,
            thread=ThreadRef(f"{source}-{external}"),
            actor=actor,
            kind="message",
            text=text,
            direct=direct,
            ack_ref=ack_ref,
        )
    )


async def test_linked_accounts_on_two_channels_are_one_initiator(
    pool: asyncpg.Pool, intake: Intake, person: str
) -> None:
    gh_login, gh_id = _unique("gh"), _github_id()
    slack_id = f"T0ACME/{_unique('U').upper()}"
    await people.link(
        pool,
        person,
        [people.AccountRef("github", gh_id, gh_login), people.AccountRef("slack", slack_id)],
    )
    from_github = await _say(intake, "github", Actor(gh_id, gh_login))
    from_slack = await _say(intake, "slack", Actor(slack_id, "Dana D."))
    stranger = await _say(intake, "slack", Actor(f"T0ACME/{_unique('U').upper()}", "Dana D."))

    assert (from_github.verdict, from_slack.verdict) == ("explicit", "explicit")
    assert stranger.verdict == "ignored"  # same display name, not a linked account
    rows = await pool.fetch(
        "SELECT t.id, p.name FROM triggers t LEFT JOIN people p ON p.id = t.person_id "
        "WHERE t.id = ANY($1::text[])",
        [from_github.trigger_id, from_slack.trigger_id, stranger.trigger_id],
    )
    names = {row["id"]: row["name"] for row in rows}
    assert names == {
        from_github.trigger_id: person,
        from_slack.trigger_id: person,
        stranger.trigger_id: None,
    }
    # The router sees who is behind each account.
    pending = await batches.take(pool, limit=10_000)
    shown = batches.render(
        batches.Batch([e for e in pending.events if e.id == from_slack.trigger_id], {}, [])
    )
    assert f"from Dana D. (person {person})" in shown


async def test_an_account_belongs_to_one_person_until_unlinked(
    pool: asyncpg.Pool, person: str
) -> None:
    account = people.AccountRef("matrix", f"@{_unique('x')}:example.org")
    await people.link(pool, person, [account])
    await people.link(pool, person, [account])  # idempotent
    other = _unique("erin")
    with pytest.raises(Conflict, match=f"linked to {person}"):
        await people.link(pool, other, [account])
    assert await people.unlink(pool, account) == person
    await people.link(pool, other, [account])
    assert (await people.everyone(pool))[other] == [str(account)]


async def _device(pool: asyncpg.Pool, name: str, owner: str) -> str:
    device_id = new_id("dev")
    await pool.execute(
        "INSERT INTO devices (id, name, owner, public_key, version) VALUES ($1, $2, $3, $4, '1')",
        device_id,
        name,
        owner,
        os.urandom(32),
    )
    return device_id


def _ticket(trigger: Ingested, device: str, title: str = "Fix it") -> dict[str, object]:
    return {
        "title": title,
        "scope": "the failing test",
        "threads": [trigger.thread_id],
        "device": device,
        "mandate_from": trigger.trigger_id,
    }


async def test_my_laptop_is_the_initiators_device_whatever_the_channel(
    pool: asyncpg.Pool, intake: Intake, person: str
) -> None:
    slack_id = f"T0ACME/{_unique('U').upper()}"
    await people.link(pool, person, [people.AccountRef("slack", slack_id)])
    laptop = await _device(pool, _unique(f"{person}-laptop"), person)
    desktop = await _device(pool, _unique(f"{person}-desktop"), person)
    await _device(pool, _unique("someone-elses-laptop"), _unique("frank"))
    tools = Toolbox(pool, intake.policy)
    request = await _say(intake, "slack", Actor(slack_id, "Dana D."))

    made = await tools.call("create_ticket", _ticket(request, "my laptop"), TURN)
    assert made.ok, made.content
    ticket = made.content["ticket"]
    row = await pool.fetchrow(
        "SELECT t.device_id, p.name AS person FROM tickets t "
        "JOIN mandates m ON m.ticket_id = t.id LEFT JOIN people p ON p.id = m.person_id "
        "WHERE t.id = $1",
        ticket,
    )
    assert row is not None
    assert (row["device_id"], row["person"]) == (laptop, person)

    ambiguous = await tools.call("create_ticket", _ticket(request, "my machine"), TURN)
    assert not ambiguous.ok
    assert "several devices" in ambiguous.content["error"]
    await pool.execute("UPDATE devices SET revoked_at = now() WHERE id = $1", laptop)
    only = await tools.call("create_ticket", _ticket(request, "my laptop", "Again"), TURN)
    assert only.ok, only.content  # the one device left is theirs
    assert (
        await pool.fetchval("SELECT device_id FROM tickets WHERE id = $1", only.content["ticket"])
        == desktop
    )


async def test_my_laptop_for_someone_without_devices_is_refused_with_the_fix(
    pool: asyncpg.Pool, intake: Intake, person: str
) -> None:
    gh_id = _github_id()
    await people.link(pool, person, [people.AccountRef("github", gh_id, person)])
    request = await _say(intake, "github", Actor(gh_id, person))
    refused = await Toolbox(pool, intake.policy).call(
        "create_ticket", _ticket(request, "my laptop"), TURN
    )
    assert not refused.ok
    assert "owns no paired device" in refused.content["error"]
    assert "superagent devices pair" in refused.content["error"]


async def test_web_chat_users_are_explicit_under_the_default_policy(
    pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession]
) -> None:
    await save_policy(db, Admission())
    intake = Intake(pool)
    console_user = Actor("web:admin", "admin", groups=(WEB_CONSOLE_GROUP,))
    assert (await _say(intake, "web", console_user, "hi", direct=True)).verdict == "explicit"
    assert (await _say(intake, "slack", Actor("U1", "x"), "@superagent hi")).verdict == "ignored"


async def test_an_explicit_request_is_acknowledged_and_others_are_not(
    pool: asyncpg.Pool, intake: Intake, person: str
) -> None:
    gh_id = _github_id()
    await people.link(pool, person, [people.AccountRef("github", gh_id)])
    asked = await _say(intake, "github", Actor(gh_id, person), ack_ref="issue_comment:1")
    # Someone else, whatever they call themselves, is not the person.
    chatter = await _say(intake, "github", Actor(_github_id(), person), ack_ref="issue_comment:2")
    acks = await pool.fetch(
        "SELECT key, payload->>'message_ref' AS ref FROM effects WHERE kind = $1 "
        "AND key = ANY($2::text[])",
        EffectKind.ACKNOWLEDGE,
        [asked.trigger_id, chatter.trigger_id],
    )
    assert [(row["key"], row["ref"]) for row in acks] == [(asked.trigger_id, "issue_comment:1")]


class _Recorder(ChannelAdapter):
    def __init__(self, source: str) -> None:
        self.sent: list[OutboundMessage] = []
        type(self).source = source

    async def send(self, message: OutboundMessage) -> str:
        self.sent.append(message)
        return f"m{len(self.sent)}"


def _long(words: int) -> str:
    return " ".join(f"w{i}" for i in range(words))


@pytest.mark.parametrize(("source", "cut"), [("slack", True), ("github", False)])
async def test_chat_replies_are_at_most_100_words_and_github_replies_are_whole(
    pool: asyncpg.Pool, intake: Intake, person: str, source: str, cut: bool
) -> None:
    request = await _say(intake, source, Actor("1", person))
    tools = Toolbox(pool, intake.policy)
    long_reply = await tools.call("reply", {"thread": request.thread_id, "text": _long(101)}, TURN)
    assert long_reply.ok is not cut
    if cut:
        assert "at most 100 words" in long_reply.content["error"]
    # Another writer's long text still goes out within the limit.
    recorder = type("Recorder", (_Recorder,), {})(source)
    send: Callable[[ClaimedEffect], object] = reply_handler(pool, Channels([recorder]))
    thread = await pool.fetchrow("SELECT external_id FROM threads WHERE id = $1", request.thread_id)
    assert thread is not None
    reply_id = new_id("msg")
    payload = {
        "reply_id": reply_id,
        "thread_id": request.thread_id,
        "source": source,
        "thread_external_id": thread["external_id"],
        "text": _long(150),
    }
    await send(ClaimedEffect("eff_x", "reply", reply_id, payload, 1, 1))  # type: ignore[misc]
    await send(ClaimedEffect("eff_x", "reply", reply_id, payload, 1, 2))  # type: ignore[misc]
    assert len(recorder.sent) == 1  # recorded in sent_messages: a retry sends nothing
    words = len(recorder.sent[0].text.split())
    assert words == (101 if cut else 150)  # 100 words and an ellipsis, or all of it
    assert (
        await pool.fetchval("SELECT external_id FROM sent_messages WHERE reply_id = $1", reply_id)
        == "m1"
    )


def test_users_cli_links_lists_and_unlinks(database_url: str) -> None:
    person = _unique("gail")
    env = {**os.environ, "DATABASE_URL": database_url}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "controlplane.cli", "users", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )

    # Ids need no lookup (a handle would be resolved through the channel's API).
    gh_id = _github_id()
    linked = cli("link", person, f"github:{gh_id}", "matrix:@g:example.org")
    assert linked.returncode == 0, linked.stderr
    listed = cli("list")
    assert f"{person}: github:{gh_id}, matrix:@g:example.org" in listed.stdout
    bad = cli("link", person, "myspace:tom")
    assert bad.returncode != 0
    assert "unknown channel 'myspace'" in bad.stderr
    assert "Traceback" not in bad.stderr
    unlinked = cli("unlink", "matrix:@g:example.org")
    assert unlinked.returncode == 0, unlinked.stderr
    assert f"no longer linked to {person}" in unlinked.stdout
