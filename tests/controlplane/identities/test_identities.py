"""Identity by immutable ids: the attacker's side of "who sent this event".

Allowlists, bot blocklists, the agent's own ids and account links match each channel's
immutable id (a GitHub numeric id, a Slack team + user id, a Lark open_id, a Matrix id, the
web chat's one principal), never a display name or handle someone can choose, rename or
re-register. A handle in a policy or a link is resolved to its id once, on save, through the
channel's API (real HTTP to the fakes); one that cannot be resolved is refused.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from alembic import command
from pydantic import SecretStr
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from websockets.asyncio.client import connect

from controlplane import handles, people
from controlplane.api.app import create_app
from controlplane.channels.base import Channels
from controlplane.channels.github.events import sign as github_sign
from controlplane.channels.lark.adapter import LarkAdapter
from controlplane.channels.slack import SlackAdapter
from controlplane.channels.slack.signing import sign as slack_sign
from controlplane.db import migrate
from controlplane.db.urls import asyncpg_dsn
from controlplane.errors import InvalidInput
from controlplane.ingest.admission import Admission, SourceAdmission
from controlplane.ingest.intake import Ingested, Intake
from controlplane.settings import GithubSettings, LarkSettings, Settings, SlackSettings
from controlplane.web.state import AppState
from superagent_shared.ids import new_id
from tests.controlplane.channels.test_webchat import ready, recv, say, serving
from tests.fakes.github_server import FakeGitHub
from tests.fakes.lark_server import APP_ID, APP_SECRET, BOT_NAME, BOT_OPEN_ID, FakeLark
from tests.fakes.slack_server import BOT_TOKEN, BOT_USER, TEAM_ID, FakeSlack
from tests.support.helpers import save_policy

SLACK_SECRET = "slack-signing-secret-identities"
GITHUB_SECRET = "github-webhook-secret-identities"
CHAT_TOKEN = "chat-token-identities-0123456789abcdef"
OTHER_ORG = "T0OTHERORG"  # a Slack Connect partner's workspace
_CHANNEL_ENV = ("SUPERAGENT_GITHUB__", "SUPERAGENT_SLACK__", "SUPERAGENT_LARK__")


def _unique(prefix: str) -> str:
    return f"{prefix}-{new_id('dev')[4:].lower()}"


# -- the CLI, as an admin runs it -------------------------------------------------------


async def _cli(database_url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(_CHANNEL_ENV)}
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "controlplane.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, "DATABASE_URL": database_url, **env},
    )


async def _latest_policy(pool: asyncpg.Pool) -> tuple[str | None, dict[str, Any]]:
    row = await pool.fetchrow(
        "SELECT id, body FROM policy_versions WHERE name = 'ingest' ORDER BY version DESC LIMIT 1"
    )
    if row is None:
        return None, {}
    body = row["body"]
    return row["id"], json.loads(body) if isinstance(body, str) else body


async def _edit_policy(
    database_url: str, pool: asyncpg.Pool, tmp_path: Path, body: dict[str, Any], **env: str
) -> subprocess.CompletedProcess[str]:
    """``superagent admission edit --file`` on top of the latest version."""
    base, _ = await _latest_policy(pool)
    path = tmp_path / f"{new_id('pol')}.json"
    path.write_text(json.dumps(body))
    args = ["policy", "edit", "--file", str(path), "--author", "admin"]
    return await _cli(database_url, *args, *(["--base", base] if base else []), **env)


def _github_env(github: FakeGitHub) -> dict[str, str]:
    return {"SUPERAGENT_GITHUB__TOKEN": github.pat, "SUPERAGENT_GITHUB__API_URL": github.url}


def _slack_env(slack: FakeSlack) -> dict[str, str]:
    return {"SUPERAGENT_SLACK__BOT_TOKEN": BOT_TOKEN, "SUPERAGENT_SLACK__API_URL": slack.api_url}


def _lark_env(lark: FakeLark) -> dict[str, str]:
    return {
        "SUPERAGENT_LARK__APP_ID": APP_ID,
        "SUPERAGENT_LARK__APP_SECRET": APP_SECRET,
        "SUPERAGENT_LARK__DOMAIN": lark.url,
    }


async def _trigger(pool: asyncpg.Pool, trigger_id: str) -> asyncpg.Record:
    row = await pool.fetchrow(
        "SELECT t.actor_id, t.actor_name, t.verdict, t.verdict_reason, p.name AS person "
        "FROM triggers t LEFT JOIN people p ON p.id = t.person_id WHERE t.id = $1",
        trigger_id,
    )
    assert row is not None
    return row


# -- Slack --------------------------------------------------------------------------------


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with FakeSlack() as fake:
        fake.add_user("U0ALICE", "alice", email="alice@acme.example")
        # Slack Connect: a partner organisation's member, named like ours.
        fake.add_user("U0PARTNER", "alice", team_id=OTHER_ORG, email="alice@partner.example")
        fake.add_channel("C0SHARED")
        yield fake


@asynccontextmanager
async def _slack_events(pool: asyncpg.Pool, slack: FakeSlack) -> AsyncIterator[httpx.AsyncClient]:
    settings = SlackSettings(
        bot_token=SecretStr(BOT_TOKEN),
        signing_secret=SecretStr(SLACK_SECRET),
        api_url=slack.api_url,
    )
    adapter = SlackAdapter(settings, Intake(pool))
    state = AppState(
        settings=Settings(slack=settings),
        replica_id="test",
        intake=adapter.intake,
        pool=pool,
        channels=Channels([adapter]),
    )
    transport = httpx.ASGITransport(app=create_app(state), raise_app_exceptions=False)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client
    finally:
        await adapter.close()


async def _slack_post(client: httpx.AsyncClient, callback: dict[str, Any]) -> str:
    content = json.dumps(callback).encode()
    timestamp = str(int(time.time()))
    response = await client.post(
        "/webhooks/slack",
        content=content,
        headers={
            "Content-Type": "application/json",
            "X-Slack-Request-Timestamp": timestamp,
            "X-Slack-Signature": slack_sign(SLACK_SECRET.encode(), timestamp, content),
        },
    )
    assert response.status_code == 200, response.text
    return str(response.json()["trigger"]["id"])


async def test_a_slack_connect_user_with_an_allowlisted_handle_or_user_id_is_not_allowlisted(
    pool: asyncpg.Pool, database_url: str, slack: FakeSlack, tmp_path: Path
) -> None:
    # The admin allowlists alice by her user id and by her handle.
    saved = await _edit_policy(
        database_url,
        pool,
        tmp_path,
        {"sources": {"slack": {"users": ["U0ALICE", "alice"]}}},
        **_slack_env(slack),
    )
    assert saved.returncode == 0, saved.stderr
    mention = f"<@{BOT_USER}> deploy main to production"
    async with _slack_events(pool, slack) as client:
        alice = await _slack_post(client, slack.say("C0SHARED", "U0ALICE", mention))
        # Another organisation's member with the same handle, in a shared channel...
        same_handle = await _slack_post(
            client, slack.say("C0SHARED", "U0PARTNER", mention, team=OTHER_ORG)
        )
        # ...and one whose user id, unique only within their own workspace, is alice's.
        same_user_id = await _slack_post(
            client, slack.say("C0SHARED", "U0ALICE", mention, team=OTHER_ORG)
        )

    assert (await _trigger(pool, alice))["verdict"] == "explicit"
    for attacker in (same_handle, same_user_id):
        row = await _trigger(pool, attacker)
        assert row["verdict"] == "ignored", dict(row)
        assert "not allowlisted" in row["verdict_reason"]
        assert str(row["actor_id"]).startswith(f"{OTHER_ORG}/")


# -- GitHub -------------------------------------------------------------------------------


@asynccontextmanager
async def _github_webhooks(pool: asyncpg.Pool) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(github=GithubSettings(webhook_secret=SecretStr(GITHUB_SECRET)))
    state = AppState(settings=settings, pool=pool, replica_id="test", intake=Intake(pool))
    transport = httpx.ASGITransport(app=create_app(state), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client


async def _github_comment(client: httpx.AsyncClient, user: dict[str, Any], text: str) -> str:
    comment_id = secrets.randbelow(10**9)
    payload = {
        "action": "created",
        "issue": {"number": 7, "title": "Flaky test", "html_url": "https://github.com/a/b/7"},
        "comment": {"id": comment_id, "body": text, "user": user},
        "repository": {"full_name": "acme/app", "id": 1, "private": True},
        "sender": user,
    }
    body = json.dumps(payload).encode()
    response = await client.post(
        "/webhooks/github",
        content=body,
        headers={
            "X-GitHub-Event": "issue_comment",
            "X-GitHub-Delivery": str(uuid.uuid4()),
            "X-Hub-Signature-256": github_sign(GITHUB_SECRET.encode(), body),
            "Content-Type": "application/json",
        },
    )
    assert response.status_code == 202, response.text
    return str(response.json()["triggers"][0]["id"])


async def test_a_renamed_github_login_registered_again_is_not_the_allowlisted_account(
    pool: asyncpg.Pool, database_url: str, tmp_path: Path
) -> None:
    login = _unique("gh")
    with FakeGitHub() as github:
        original = github.user(login)
        saved = await _edit_policy(
            database_url,
            pool,
            tmp_path,
            {"sources": {"github": {"users": [login]}}},
            **_github_env(github),
        )
        assert saved.returncode == 0, saved.stderr
        # The allowlisted account renames itself; someone registers the freed login.
        renamed = github.rename_user(login, f"{login}-new")
        squatter = github.user(login)
        assert squatter["id"] != original["id"] == renamed["id"]

    async with _github_webhooks(pool) as client:
        by_squatter = await _github_comment(client, squatter, "@superagent push to main")
        by_renamed = await _github_comment(client, renamed, "@superagent fix the test")

    squat = await _trigger(pool, by_squatter)
    assert (squat["actor_id"], squat["actor_name"], squat["verdict"]) == (
        str(squatter["id"]),
        login,
        "ignored",
    )
    assert (await _trigger(pool, by_renamed))["verdict"] == "explicit"  # the id still is


async def test_an_account_linked_by_github_login_follows_the_account_not_the_login(
    pool: asyncpg.Pool,
    database_url: str,
    db: async_sessionmaker[AsyncSession],
) -> None:
    person, login = _unique("dana"), _unique("gh")
    with FakeGitHub() as github:
        original = github.user(login)
        linked = await _cli(
            database_url, "users", "link", person, f"github:{login}", **_github_env(github)
        )
        assert linked.returncode == 0, linked.stderr
        renamed = github.rename_user(login, f"{login}-new")
        squatter = github.user(login)
    await save_policy(db, Admission(sources={"github": SourceAdmission(users=[person])}))

    async with _github_webhooks(pool) as client:
        by_squatter = await _github_comment(client, squatter, "@superagent run it on my laptop")
        by_renamed = await _github_comment(client, renamed, "@superagent run it on my laptop")

    squat = await _trigger(pool, by_squatter)
    assert (squat["person"], squat["verdict"]) == (None, "ignored")
    real = await _trigger(pool, by_renamed)
    assert (real["actor_id"], real["person"], real["verdict"]) == (
        str(original["id"]),
        person,
        "explicit",
    )


# -- Lark ---------------------------------------------------------------------------------

LARK_ALICE = "ou_a11ce00000000000000000000000000"
LARK_MIMIC = "ou_m1m1c00000000000000000000000000"
LARK_CHAT = "oc_team00000000000000000000000000000"


def _lark_message(sender: str, event_id: str) -> dict[str, Any]:
    """An ``im.message.receive_v1`` event in a group, mentioning the bot (schema 2.0)."""
    return {
        "schema": "2.0",
        "header": {
            "event_id": event_id,
            "create_time": "1700000000000",
            "event_type": "im.message.receive_v1",
            "tenant_key": "736588c9260f175d",
            "app_id": APP_ID,
        },
        "event": {
            "sender": {
                "sender_id": {"union_id": "on_x", "user_id": "", "open_id": sender},
                "sender_type": "user",
                "tenant_key": "736588c9260f175d",
            },
            "message": {
                "message_id": f"om_{event_id}",
                "root_id": "",
                "parent_id": "",
                "create_time": "1700000000000",
                "chat_id": LARK_CHAT,
                "chat_type": "group",
                "message_type": "text",
                "content": json.dumps({"text": "@_user_1 ship the release"}),
                "mentions": [
                    {
                        "key": "@_user_1",
                        "id": {"union_id": "on_y", "user_id": "", "open_id": BOT_OPEN_ID},
                        "name": BOT_NAME,
                        "tenant_key": "736588c9260f175d",
                    }
                ],
            },
        },
    }


async def test_a_lark_user_whose_display_name_is_an_allowlisted_name_is_not_allowlisted(
    pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession]
) -> None:
    person = _unique("li")
    await people.link(pool, person, [people.AccountRef("lark", LARK_ALICE)])
    await save_policy(db, Admission(sources={"lark": SourceAdmission(users=[person])}))
    with FakeLark() as lark:
        # Someone sets their display name to the allowlisted person's name.
        lark.users = {LARK_ALICE: "Li Wei", LARK_MIMIC: person}
        settings = LarkSettings(
            app_id=APP_ID,
            app_secret=SecretStr(APP_SECRET),
            verification_token=SecretStr("lark-token"),
            domain=lark.url,
        )
        adapter = LarkAdapter(settings, Intake(pool))
        try:
            real = await adapter.handle(_lark_message(LARK_ALICE, _unique("ev")))
            mimic = await adapter.handle(_lark_message(LARK_MIMIC, _unique("ev")))
        finally:
            await adapter.close()
    assert isinstance(real, Ingested)
    assert isinstance(mimic, Ingested)
    real_row = await _trigger(pool, real.trigger_id)
    mimic_row = await _trigger(pool, mimic.trigger_id)
    assert (real_row["person"], real_row["verdict"]) == (person, "explicit")
    assert (mimic_row["actor_name"], mimic_row["person"], mimic_row["verdict"]) == (
        person,
        None,
        "ignored",
    )


# -- the web chat ---------------------------------------------------------------------------


async def test_a_web_chat_user_choosing_an_allowlisted_persons_name_gets_no_authority(
    pool: asyncpg.Pool,
    database_url: str,
    db: async_sessionmaker[AsyncSession],
) -> None:
    person = _unique("erin")
    await people.link(pool, person, [people.AccountRef("github", "31337")])
    # The chat is not allowlisted as a whole here: only the person is.
    await save_policy(db, Admission(sources={"web": SourceAdmission(users=[person], groups=[])}))
    bearer = {"Authorization": f"Bearer {CHAT_TOKEN}"}
    async with (
        serving(pool, database_url, token=CHAT_TOKEN) as served,
        connect(f"{served.ws_url}?name={person}", additional_headers=bearer) as ws,
    ):
        await ready(ws)
        await say(ws, "I am erin: run the deploy on my laptop")
        accepted = await recv(ws)
    row = await _trigger(pool, accepted["trigger"])
    assert (row["actor_id"], row["actor_name"]) == ("web:admin", person)  # a label only
    assert (row["person"], row["verdict"]) == (None, "ignored")


# -- saving handles -----------------------------------------------------------------------


async def test_an_unresolvable_handle_is_refused_on_save_saying_how_to_give_the_id(
    pool: asyncpg.Pool, database_url: str, tmp_path: Path
) -> None:
    before, _ = await _latest_policy(pool)
    ghost = _unique("ghost")
    with FakeGitHub() as github:
        refused = await _edit_policy(
            database_url,
            pool,
            tmp_path,
            {"sources": {"github": {"users": [f"github:{ghost}"]}}},
            **_github_env(github),
        )
        assert refused.returncode == 1
        assert f"github:{ghost}" in refused.stderr
        assert "numeric" in refused.stderr  # how to give the id instead
        assert "Traceback" not in refused.stderr
        no_link = await _cli(
            database_url, "users", "link", _unique("x"), f"github:{ghost}", **_github_env(github)
        )
        assert no_link.returncode != 0
        assert f"github:{ghost}" in no_link.stderr
        assert "Traceback" not in no_link.stderr

    with FakeLark() as lark:  # a display name is not an identity, and Lark has no handles
        named = await _edit_policy(
            database_url,
            pool,
            tmp_path,
            {"sources": {"lark": {"users": ["Li Wei"]}}},
            **_lark_env(lark),
        )
    assert named.returncode == 1
    assert "Li Wei" in named.stderr
    assert "open_id" in named.stderr

    web = await _cli(database_url, "users", "link", _unique("x"), "web:alice")
    assert web.returncode != 0
    assert "web:admin" in web.stderr  # the chat's one identity; names typed there are labels

    assert (await _latest_policy(pool))[0] == before  # nothing was saved


async def test_a_resolvable_handle_is_stored_as_its_id(
    pool: asyncpg.Pool, database_url: str, tmp_path: Path, slack: FakeSlack
) -> None:
    login, person = _unique("octo"), _unique("gail")
    li = "ou_11we100000000000000000000000000"
    with FakeGitHub() as github, FakeLark() as lark:
        octo = github.user(login)
        bot = github.app_user
        lark.emails = {"li@acme.example": li}
        env = {**_github_env(github), **_slack_env(slack), **_lark_env(lark)}
        saved = await _edit_policy(
            database_url,
            pool,
            tmp_path,
            {
                "agent_ids": [f"github:{bot['login']}"],
                "sources": {
                    "github": {"users": [f"github:{login}"]},
                    "slack": {"users": ["@alice", "slack:alice@acme.example"]},
                    "lark": {"users": ["lark:li@acme.example"]},
                },
            },
            **env,
        )
        assert saved.returncode == 0, saved.stderr
        linked = await _cli(database_url, "users", "link", person, f"github:{login}", **env)
        assert linked.returncode == 0, linked.stderr

    _, body = await _latest_policy(pool)
    assert body["agent_ids"] == [str(bot["id"])]
    assert body["sources"]["github"]["users"] == [str(octo["id"])]
    # Both handles are alice of our own workspace (not the partner's "alice"): one entry.
    assert body["sources"]["slack"]["users"] == [f"{TEAM_ID}/U0ALICE"]
    assert body["sources"]["lark"]["users"] == [li]
    # What each id was resolved from, for people reading the document; never matched.
    assert body["labels"][str(octo["id"])] == f"github:{login}"
    assert body["labels"][f"{TEAM_ID}/U0ALICE"] in ("slack:@alice", "slack:alice@acme.example")

    listed = await _cli(database_url, "users", "list")
    assert f"{person}: github:{octo['id']} ({login})" in listed.stdout
    unlinked = await _cli(database_url, "users", "unlink", f"github:{octo['id']}")
    assert unlinked.returncode == 0, unlinked.stderr


async def test_without_the_channels_api_a_handle_resolves_from_triggers_seen_if_unambiguous(
    pool: asyncpg.Pool, database_url: str, tmp_path: Path
) -> None:
    seen, twice = _unique("seen"), _unique("twice")
    async with _github_webhooks(pool) as client:
        await _github_comment(client, {"login": seen, "id": 5550001, "type": "User"}, "hi")
        # A login seen with two ids (renamed and registered again) names nobody for sure.
        await _github_comment(client, {"login": twice, "id": 5550002, "type": "User"}, "hi")
        await _github_comment(client, {"login": twice, "id": 5550003, "type": "User"}, "hi")

    saved = await _edit_policy(
        database_url, pool, tmp_path, {"sources": {"github": {"users": [f"github:{seen}"]}}}
    )
    assert saved.returncode == 0, saved.stderr
    assert (await _latest_policy(pool))[1]["sources"]["github"]["users"] == ["5550001"]
    refused = await _edit_policy(
        database_url, pool, tmp_path, {"sources": {"github": {"users": [f"github:{twice}"]}}}
    )
    assert refused.returncode == 1
    assert "5550002" in refused.stderr
    assert "5550003" in refused.stderr


async def test_policy_entries_are_ids_people_or_handles_said_as_such(pool: asyncpg.Pool) -> None:
    person = _unique("hana")
    await people.link(pool, person, [people.AccountRef("matrix", "@hana:example.org")])
    body = Admission(
        agent_ids=["136532741"],
        default=SourceAdmission(users=[person, "@bob:example.org", "T0ACME/U0BOB"]),
        sources={"web": SourceAdmission(users=["web:admin"], groups=["console"])},
    ).model_dump(mode="json")
    async with handles.Resolver(Settings(), pool) as resolver:
        kept, notes = await resolver.policy(body)
        assert kept == body  # ids and people need no lookup
        assert notes == []
        for where, entry, why in (
            ("default", "octocat", "SOURCE:HANDLE"),  # which channel's octocat?
            ("slack", "github:octocat", "never come from it"),
            ("web", "alice", "web:admin"),  # a name typed in the chat
            ("matrix", "Alice", "@name:server"),
        ):
            wrong = Admission(
                default=SourceAdmission(users=[entry]) if where == "default" else SourceAdmission(),
                sources={} if where == "default" else {where: SourceAdmission(users=[entry])},
            ).model_dump(mode="json")
            with pytest.raises(InvalidInput, match=why) as refused:
                await resolver.policy(wrong)
            assert entry in refused.value.message
    with pytest.raises(InvalidInput, match="reads as a github id"):
        people.check_name("583231")  # a person named like an id would be allowlisted as one


# -- the migration --------------------------------------------------------------------------


async def test_the_migration_converts_handles_to_ids_and_leaves_the_rest_inert(
    empty_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    await migrate.upgrade(empty_database, "0011")
    conn = await asyncpg.connect(asyncpg_dsn(empty_database))
    try:
        await _old_world(conn)
    finally:
        await conn.close()
    with caplog.at_level(logging.WARNING):
        await migrate.upgrade(empty_database, "0012")

    conn = await asyncpg.connect(asyncpg_dsn(empty_database))
    try:
        accounts = {
            (row["source"], row["handle"]): row["name"]
            for row in await conn.fetch(
                "SELECT a.source, a.handle, p.name FROM accounts a JOIN people p "
                "ON p.id = a.person_id"
            )
        }
        body = await conn.fetchval("SELECT body FROM policy_versions ORDER BY version DESC LIMIT 1")
        web = await conn.fetch("SELECT DISTINCT actor_id FROM triggers WHERE source = 'web'")
    finally:
        await conn.close()
    policy = json.loads(body) if isinstance(body, str) else body

    # Converted from the triggers already stored.
    assert accounts[("github", "101")] == "alice"  # the login alice had, seen with id 101
    assert accounts[("slack", "T0ACME/U0ALICE")] == "alice"  # its team from the payloads
    assert accounts[("matrix", "@alice:example.org")] == "alice"  # an id already
    # Not convertible: kept, but under a handle no actor id can ever equal. A name typed
    # in the web chat was never an identity: every chat user is the admin principal.
    assert ("github", "never-seen") not in accounts
    assert accounts[("github", "unresolved:never-seen")] == "alice"
    assert accounts[("web", "unresolved:carol")] == "carol"
    assert any("never-seen" in message for message in caplog.messages)
    assert any("carol" in message for message in caplog.messages)

    assert policy["sources"]["github"]["users"] == ["101", "alice"]  # a person stays
    assert policy["sources"]["slack"]["users"] == ["T0ACME/U0ALICE"]
    assert policy["agent_ids"] == ["9"]
    assert "ghost-login" not in json.dumps(policy["sources"]["github"]["users"])
    assert policy["unresolved"] == ["sources.github.users: ghost-login"]  # inert, on record
    assert any("ghost-login" in message for message in caplog.messages)
    assert [row["actor_id"] for row in web] == ["web:admin"]

    # And back: what the old code reads (its ids, no fields it does not know).
    async with migrate.engine(empty_database) as engine, engine.begin() as sync:
        await sync.run_sync(_downgrade_to_0011)
    conn = await asyncpg.connect(asyncpg_dsn(empty_database))
    try:
        back = await conn.fetchval("SELECT body FROM policy_versions ORDER BY version DESC LIMIT 1")
        handles = {row["handle"] for row in await conn.fetch("SELECT handle FROM accounts")}
        web_ids = await conn.fetch("SELECT actor_id FROM triggers WHERE source = 'web'")
    finally:
        await conn.close()
    old_policy = json.loads(back) if isinstance(back, str) else back
    assert "labels" not in old_policy
    assert "unresolved" not in old_policy
    assert old_policy["sources"]["slack"]["users"] == ["U0ALICE"]
    assert "ghost-login" in old_policy["sources"]["github"]["users"]
    assert {"101", "u0alice", "never-seen", "carol"} <= handles
    assert [row["actor_id"] for row in web_ids] == ["web:carol"]


def _downgrade_to_0011(connection: Connection) -> None:
    config = migrate.alembic_config()
    config.attributes["connection"] = connection
    command.downgrade(config, "0011")


async def _old_world(conn: asyncpg.Connection) -> None:
    """What a deployment before immutable ids holds: links and policies by handle."""
    await conn.execute(
        "INSERT INTO people (id, name) VALUES ('prs_alice', 'alice'), ('prs_carol', 'carol')"
    )
    await conn.executemany(
        "INSERT INTO accounts (source, handle, person_id) VALUES ($1, $2, $3)",
        [
            ("github", "alice", "prs_alice"),  # a login
            ("github", "never-seen", "prs_alice"),  # a login no trigger ever showed
            ("slack", "u0alice", "prs_alice"),  # a bare user id, casefolded as stored
            ("matrix", "@alice:example.org", "prs_alice"),
            ("web", "carol", "prs_carol"),  # a name typed in the chat
        ],
    )
    await conn.execute(
        "INSERT INTO threads (id, source, external_id) VALUES "
        "('thr_gh', 'github', 'acme/app#1'), ('thr_sl', 'slack', 'C1:1.1'), "
        "('thr_web', 'web', 'chat_1')"
    )
    slack_payload = json.dumps(
        {
            "team_id": "T0ACME",
            "event": {"type": "app_mention", "user": "U0ALICE", "team": "T0ACME"},
        }
    ).encode()
    await conn.execute(
        "INSERT INTO blobs (id, content_type, size, data) VALUES ('blb_sl', 'application/json', "
        "$1, $2)",
        len(slack_payload),
        slack_payload,
    )
    await conn.executemany(
        "INSERT INTO triggers (id, source, external_id, thread_id, actor_id, actor_name, "
        "actor_is_bot, kind, text, payload_blob_id) VALUES ($1, $2, $3, $4, $5, $6, $7, 'm', "
        "'', $8)",
        [
            ("trg_gh", "github", "e1", "thr_gh", "101", "alice", False, None),
            ("trg_bot", "github", "e2", "thr_gh", "9", "superagent[bot]", True, None),
            ("trg_sl", "slack", "e3", "thr_sl", "U0ALICE", "alice", False, "blb_sl"),
            ("trg_web", "web", "web:carol:c1", "thr_web", "web:carol", "carol", False, None),
        ],
    )
    policy = {
        "agent_ids": ["superagent[bot]"],
        "sources": {
            "github": {"users": ["alice", "ghost-login"]},
            "slack": {"users": ["U0ALICE"]},
        },
    }
    await conn.execute(
        "INSERT INTO policy_versions (id, name, version, body, author) "
        "VALUES ('pol_old', 'ingest', 1, $1::jsonb, 'admin')",
        json.dumps(policy),
    )
