"""Every channel through a real replica: `superagent serve` wired to fake GitHub and Slack.

The adapters are tested one by one in their own modules; this proves the assembly: the
registry builds them from settings, the replica runs their loops (Slack's Socket Mode on
every replica, GitHub polling only on the leader), the outbox sends replies and 👀 through
them, and the web chat answers `superagent say`. The router runs in rules-only mode, so
`/devices` gets a deterministic answer on each channel.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.channels.github.events import sign
from controlplane.ingest.admission import WEB_CONSOLE_GROUP, Admission, SourceAdmission
from tests.fakes.github_server import FakeGitHub
from tests.fakes.slack_server import APP_TOKEN, BOT_TOKEN, BOT_USER, TEAM_ID, FakeSlack
from tests.support.helpers import assert_eventually, free_port, save_policy

SECRET = "e2e-webhook-secret"
HOOKED, POLLED = "acme/app", "acme/polled"
CHANNEL = "C0GENERAL"
ALICE_SLACK = "U0ALICE"
# What rules-only mode answers to /devices (other tests in this database may pair some).
_DEVICE_ANSWERS = ("No devices are paired", "Devices:")


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    with FakeGitHub() as fake:
        fake.add_repo(HOOKED)
        fake.add_repo(POLLED)
        yield fake


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with FakeSlack() as fake:
        fake.add_user(ALICE_SLACK, "alice")
        fake.add_channel(CHANNEL)
        yield fake


@pytest.fixture
def replica(
    database_url: str, tmp_path: Path, github: FakeGitHub, slack: FakeSlack
) -> Iterator[str]:
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "SUPERAGENT_STATE_DIR": str(tmp_path),
        "SUPERAGENT_HTTP__PORT": str(port),
        "SUPERAGENT_GRPC__PORT": "0",
        "SUPERAGENT_GITHUB__TOKEN": github.pat,
        "SUPERAGENT_GITHUB__API_URL": github.url,
        "SUPERAGENT_GITHUB__WEBHOOK_SECRET": SECRET,
        "SUPERAGENT_GITHUB__AGENT_LOGIN": "octo-agent",
        "SUPERAGENT_GITHUB__POLL_REPOS": POLLED,
        "SUPERAGENT_GITHUB__POLL_SECONDS": "1",
        "SUPERAGENT_SLACK__BOT_TOKEN": BOT_TOKEN,
        "SUPERAGENT_SLACK__APP_TOKEN": APP_TOKEN,
        "SUPERAGENT_SLACK__API_URL": slack.api_url,
        "SUPERAGENT_ROUTER__LEASE_SECONDS": "3",
        "SUPERAGENT_ROUTER__RENEW_SECONDS": "1",
    }
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "SUPERAGENT_ADMIN_TOKEN"):
        env.pop(name, None)
    log = tmp_path / "replica.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "controlplane.cli", "serve"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        text = log.read_text(errors="replace")
        for secret in (github.pat, BOT_TOKEN, APP_TOKEN, SECRET):
            assert secret not in text, "a secret reached the replica's log"


async def _up(url: str) -> bool:
    try:
        async with httpx.AsyncClient() as client:
            return (await client.get(f"{url}/readyz")).status_code == 200
    except httpx.HTTPError:
        return False


async def test_one_replica_serves_github_slack_and_web_chat(
    replica: str,
    github: FakeGitHub,
    slack: FakeSlack,
    pool: asyncpg.Pool,
    db: async_sessionmaker[AsyncSession],
    tmp_path: Path,
) -> None:
    await save_policy(
        db,
        Admission(
            sources={
                # Allowlisted by immutable ids: alice's GitHub user id, her Slack TEAM/USER.
                "github": SourceAdmission(users=[str(github.user("alice")["id"])]),
                "slack": SourceAdmission(users=[f"{TEAM_ID}/{ALICE_SLACK}"]),
                "web": SourceAdmission(groups=[WEB_CONSOLE_GROUP]),
            }
        ),
    )
    await assert_eventually(lambda: _up(replica), timeout=60, interval=0.2)

    # GitHub, by webhook: a comment asking for the device list.
    github.open_issue(HOOKED, "Flaky test", user=github.user("alice"))
    comment = github.comment(HOOKED, 1, "@superagent /devices")
    body = json.dumps(
        {
            "action": "created",
            "issue": {"number": 1, "title": "Flaky test"},
            "comment": comment,
            "repository": {"full_name": HOOKED},
            "sender": comment["user"],
        }
    ).encode()
    async with httpx.AsyncClient() as client:
        delivered = await client.post(
            f"{replica}/webhooks/github",
            content=body,
            headers={
                "X-GitHub-Event": "issue_comment",
                "X-GitHub-Delivery": "e2e-1",
                "X-Hub-Signature-256": sign(SECRET.encode(), body),
            },
        )
    assert delivered.status_code == 202, delivered.text
    assert delivered.json()["triggers"][0]["verdict"] == "explicit"

    # Slack, over Socket Mode: a mention in a channel.
    await assert_eventually(lambda: slack.open_sockets >= 1, timeout=30)
    said = slack.say(CHANNEL, ALICE_SLACK, f"<@{BOT_USER}> /devices")
    slack.push(said)

    # GitHub, by polling (only the leader polls): a comment on another repository.
    github.open_issue(POLLED, "Another", user=github.user("alice"))
    polled = github.comment(POLLED, 1, "@superagent /devices")

    def answered_on(repo: str) -> list[dict[str, object]]:
        return [c for c in github.comments(repo, 1) if "<!-- superagent:" in str(c["body"])]

    await assert_eventually(lambda: answered_on(HOOKED), timeout=30)
    await assert_eventually(lambda: answered_on(POLLED), timeout=30)
    [reply] = answered_on(HOOKED)
    assert str(reply["body"]).startswith(_DEVICE_ANSWERS), reply["body"]
    await assert_eventually(
        lambda: [r["content"] for r in github.reactions("issue_comment", comment["id"])] == ["eyes"]
    )
    await assert_eventually(
        lambda: [r["content"] for r in github.reactions("issue_comment", polled["id"])] == ["eyes"]
    )

    ts = said["event"]["ts"]
    answers = await assert_eventually(
        lambda: [m for m in slack.thread(CHANNEL, ts) if m.get("user") == BOT_USER],
        timeout=30,
    )
    assert [m["thread_ts"] for m in answers] == [ts]  # in the request's thread
    assert str(answers[0]["text"]).startswith(_DEVICE_ANSWERS)
    reactions = await assert_eventually(lambda: slack.calls_to("reactions.add"))
    assert [(c.args["name"], c.args["timestamp"]) for c in reactions] == [("eyes", ts)]
    assert slack.acks  # the envelope was acknowledged

    # Web chat, from the terminal.
    say = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "controlplane.cli", "say", "--url", replica, "/devices"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        # No token configured: `say` reads the one the replica generated in its state dir.
        env={
            **{k: v for k, v in os.environ.items() if k != "SUPERAGENT_ADMIN_TOKEN"},
            "SUPERAGENT_STATE_DIR": str(tmp_path),
        },
    )
    out, err = await asyncio.wait_for(say.communicate(), 120)
    assert say.returncode == 0, err.decode()
    assert out.decode().startswith(_DEVICE_ANSWERS), out.decode()

    # Every reply is recorded once, on the thread it answered.
    sent = await pool.fetch("SELECT source, count(*) AS n FROM sent_messages GROUP BY source")
    assert {row["source"]: row["n"] for row in sent} == {"github": 2, "slack": 1, "web": 1}
