"""Outbound GitHub: replies as comments (once, however often retried), 👀 on requests,
pull requests opened idempotently, and answers mapped to what the outbox should do."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import asyncpg
import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.api.app import create_app
from controlplane.channels.base import (
    Acknowledgement,
    ChannelError,
    Channels,
    OutboundMessage,
    RateLimited,
)
from controlplane.channels.github.adapter import GithubAdapter, marker
from controlplane.channels.github.auth import TokenAuth
from controlplane.channels.github.client import GithubClient
from controlplane.channels.github.events import sign
from controlplane.channels.github.pull_requests import open_pull_request_handler
from controlplane.channels.outbound import acknowledge_handler, reply_handler
from controlplane.db.urls import asyncpg_dsn
from controlplane.domain import EffectKind
from controlplane.effects import Handlers
from controlplane.effects.handlers import ClaimedEffect, Permanent, Postpone
from controlplane.effects.runner import EffectRunner
from controlplane.errors import TransientError
from controlplane.ingest.admission import Admission, SourceAdmission
from controlplane.ingest.intake import Intake
from controlplane.replies import enqueue_reply
from controlplane.settings import EffectsSettings, GithubSettings, Settings
from controlplane.web.state import AppState
from tests.fakes.github_server import FakeClock, FakeGitHub
from tests.support.github_fixtures import (  # noqa: F401 - fixtures
    REPO,
    clock_fixture,
    flaky_issue_fixture,
    github_fixture,
)
from tests.support.helpers import assert_eventually, save_policy

SECRET = "whsec-outbound-test"
pytestmark = pytest.mark.usefixtures("flaky_issue")


@pytest.fixture
async def adapter(
    github: FakeGitHub, clock: FakeClock, pool: asyncpg.Pool
) -> AsyncIterator[GithubAdapter]:
    settings = GithubSettings(token=SecretStr(github.pat), api_url=github.url)
    client = GithubClient(github.url, TokenAuth(github.pat), clock=clock)
    adapter = GithubAdapter(client, Intake(pool), pool, settings)
    yield adapter
    await adapter.close()


def _reply(reply_id: str, *, first_try: bool = True, thread: str = f"{REPO}#1") -> OutboundMessage:
    return OutboundMessage(
        reply_id=reply_id,
        thread_id="thr_1",
        thread_external_id=thread,
        text="## Background\nThe test depends on the weekday.\n\n## Change\nPinned the clock.",
        first_try=first_try,
    )


async def test_a_reply_is_one_comment_with_its_marker_however_often_retried(
    github: FakeGitHub, adapter: GithubAdapter
) -> None:
    first = await adapter.send(_reply("rpl_a"))
    [comment] = github.comments(REPO, 1)
    assert first == f"issue_comment:{comment['id']}"
    assert comment["body"].startswith("## Background")
    assert comment["body"].endswith(marker("rpl_a"))
    assert marker("rpl_a") == "<!-- superagent:rpl_a -->"

    # A retry after a send that happened but was not recorded finds it instead.
    again = await adapter.send(_reply("rpl_a", first_try=False))
    assert again == first
    assert len(github.comments(REPO, 1)) == 1
    # A retry of a send that never happened posts it.
    await adapter.send(_reply("rpl_b", first_try=False))
    assert [c["body"].endswith(marker("rpl_b")) for c in github.comments(REPO, 1)] == [
        False,
        True,
    ]
    # Only retries look (the first attempt spends no listing on it).
    assert len(github.calls("GET", "/issues/1/comments")) == 2
    assert len(github.calls("POST", "/issues/1/comments")) == 2


async def test_a_reply_posted_but_not_recorded_is_not_posted_twice(
    github: FakeGitHub, adapter: GithubAdapter, pool: asyncpg.Pool, database_url: str
) -> None:
    """A runner posts a reply and is stopped before recording it (its handler cancelled,
    the effect handed back). Meanwhile the same reply is queued again (a worker's round
    replayed). Both start the effect's attempts over, so the next claim is "attempt 1"
    although the reply is on GitHub: the outbox must still look for its marker first."""
    thread_id = "thr_requeued"
    await pool.execute(
        "INSERT INTO threads (id, source, external_id) VALUES ($1, 'github', $2)",
        thread_id,
        f"{REPO}#1",
    )
    text, reply_id = "Done: tkt_1 pinned the clock.", "msg_requeued"
    async with pool.acquire() as conn:
        await enqueue_reply(conn, thread_id, text, reply_id)
    posted_once = asyncio.Event()

    class PostsThenHangs(GithubAdapter):
        async def send(self, message: OutboundMessage) -> str:
            await super().send(message)
            posted_once.set()
            await asyncio.Event().wait()  # stopped here: posted, never recorded
            raise AssertionError("unreachable")

    hanging = PostsThenHangs(adapter.client, adapter.intake, pool, adapter.settings)
    await _run_replies(database_url, pool, hanging, until=posted_once.is_set)
    async with pool.acquire() as conn:
        assert await enqueue_reply(conn, thread_id, text, reply_id)  # not recorded as sent
    await _run_replies(database_url, pool, adapter, until=lambda: _no_effects(pool))

    posted = [c for c in github.comments(REPO, 1) if c["body"].endswith(marker(reply_id))]
    assert len(posted) == 1, [c["body"] for c in posted]
    assert await pool.fetchval("SELECT count(*) FROM sent_messages WHERE reply_id = $1", reply_id)


async def _run_replies(
    database_url: str,
    pool: asyncpg.Pool,
    adapter: GithubAdapter,
    until: Callable[[], object],
) -> None:
    """An effect runner sending replies through ``adapter`` until ``until`` holds."""
    handlers = Handlers()
    handlers.register(EffectKind.REPLY, reply_handler(pool, Channels([adapter])))
    runner = EffectRunner(asyncpg_dsn(database_url), handlers, EffectsSettings(), owner="t")
    await runner.start()
    try:
        await assert_eventually(until, message="the reply effect got that far")
    finally:
        await runner.stop()


async def _no_effects(pool: asyncpg.Pool) -> bool:
    return not await pool.fetchval("SELECT count(*) FROM effects")


async def test_the_marker_is_found_beyond_the_first_page(
    github: FakeGitHub, adapter: GithubAdapter
) -> None:
    for n in range(130):
        github.comment(REPO, 1, f"chatter {n}")
    await adapter.send(_reply("rpl_late"))
    await adapter.send(_reply("rpl_late", first_try=False))
    assert len(github.comments(REPO, 1)) == 131
    listed = [r.query.get("page", "1") for r in github.calls("GET", "/issues/1/comments")]
    assert listed == ["1", "2"]


async def test_acknowledging_reacts_with_eyes_once(
    github: FakeGitHub, adapter: GithubAdapter
) -> None:
    comment = github.comment(REPO, 1, "@superagent please fix")
    pr = github.open_issue(REPO, "Fix", pull=True)
    review = github.review_comment(REPO, pr["number"], "@superagent rename this")
    refs = [
        (f"issue_comment:{comment['id']}", ("issue_comment", comment["id"])),
        ("issue:1", ("issue", 1)),
        (
            f"pull_request_review_comment:{review['id']}",
            ("pull_request_review_comment", review["id"]),
        ),
    ]
    for ref, (kind, ident) in refs:
        for _ in range(2):  # a retried acknowledgement is harmless
            await adapter.acknowledge(Acknowledgement("trg_1", f"{REPO}#1", ref))
        reactions = github.reactions(kind, ident)
        assert [r["content"] for r in reactions] == ["eyes"], ref
    with pytest.raises(ChannelError, match="not a GitHub message reference"):
        await adapter.acknowledge(Acknowledgement("trg_1", f"{REPO}#1", "commit:abc"))


async def test_opening_a_pull_request_twice_gives_the_same_one(
    github: FakeGitHub, adapter: GithubAdapter
) -> None:
    client = adapter.client
    url = await client.open_pull_request(
        REPO, head="agent/fix-flaky", base="main", title="Fix the flaky test", body="Closes #1"
    )
    again = await client.open_pull_request(
        REPO, head="agent/fix-flaky", base="main", title="Fix the flaky test", body="Closes #1"
    )
    assert url == again
    [pull] = github.pulls(REPO)
    assert pull["html_url"] == url
    assert (pull["head"]["ref"], pull["base"]["ref"], pull["title"]) == (
        "agent/fix-flaky",
        "main",
        "Fix the flaky test",
    )
    assert len(github.calls("POST", "/pulls")) == 1
    # Someone (an earlier attempt) opened it meanwhile: that one is returned, none added.
    other = github.open_issue(REPO, "By hand", pull=True, head="agent/other")
    found = await client.open_pull_request(
        REPO, head="agent/other", base="main", title="x", body=""
    )
    assert found == other["html_url"]
    assert len(github.pulls(REPO)) == 2


def _effect(kind: str, payload: dict[str, object], attempt: int = 1) -> ClaimedEffect:
    return ClaimedEffect("eff_1", kind, "k", payload, generation=1, attempt=attempt)


async def test_the_open_pull_request_effect_records_the_url_on_the_ticket(
    github: FakeGitHub, adapter: GithubAdapter, pool: asyncpg.Pool
) -> None:
    await pool.execute("INSERT INTO tickets (id, title) VALUES ('tkt_pr', 'Fix the flaky test')")
    handler = open_pull_request_handler(pool, Channels([adapter]))
    payload: dict[str, object] = {
        "repo": REPO,
        "head": "agent/tkt_pr",
        "base": "main",
        "title": "Fix the flaky test",
        "body": "Background: ...",
        "ticket_id": "tkt_pr",
    }
    await handler(_effect(EffectKind.OPEN_PULL_REQUEST, payload))
    await handler(_effect(EffectKind.OPEN_PULL_REQUEST, payload, attempt=2))  # a retry
    [pull] = github.pulls(REPO)
    assert await pool.fetchval("SELECT pr_url FROM tickets WHERE id = 'tkt_pr'") == pull["html_url"]

    with pytest.raises(Permanent, match="needs head"):
        await handler(_effect(EffectKind.OPEN_PULL_REQUEST, {**payload, "head": ""}))
    with pytest.raises(Permanent, match="404"):
        await handler(_effect(EffectKind.OPEN_PULL_REQUEST, {**payload, "repo": "acme/gone"}))
    unconfigured = open_pull_request_handler(pool, Channels())
    with pytest.raises(Postpone, match="not configured"):
        await unconfigured(_effect(EffectKind.OPEN_PULL_REQUEST, payload))


async def test_githubs_answers_become_what_the_outbox_does(
    github: FakeGitHub, clock: FakeClock, adapter: GithubAdapter
) -> None:
    # Gone or never there: park it, saying what to check.
    with pytest.raises(ChannelError, match="404") as gone:
        await adapter.send(_reply("rpl_x", thread=f"{REPO}#99"))
    assert "install the App" in str(gone.value)
    with pytest.raises(ChannelError, match="not a GitHub thread"):
        await adapter.send(_reply("rpl_x", thread="acme/app/issues/1"))
    # GitHub's 5xx: a plain failure, retried by the outbox.
    github.fail(502)
    with pytest.raises(TransientError):
        await adapter.send(_reply("rpl_x"))
    # Rate limited: wait until the reset GitHub names, without asking again before it.
    github.limit_rate(90)
    with pytest.raises(RateLimited) as limited:
        await adapter.send(_reply("rpl_x"))
    assert 89 <= limited.value.seconds <= 91
    asked = len(github.requests)
    with pytest.raises(RateLimited):
        await adapter.send(_reply("rpl_x"))
    assert len(github.requests) == asked
    clock.advance(91)
    await adapter.send(_reply("rpl_x"))
    # A secondary limit: 429 with Retry-After.
    github.limit_rate(30, status=429)
    with pytest.raises(RateLimited) as secondary:
        await adapter.send(_reply("rpl_y"))
    assert secondary.value.seconds == 30
    assert len(github.comments(REPO, 1)) == 1


async def test_an_explicit_request_is_acknowledged_end_to_end(
    github: FakeGitHub,
    adapter: GithubAdapter,
    pool: asyncpg.Pool,
    db: async_sessionmaker[AsyncSession],
) -> None:
    alice = str(github.user("alice")["id"])  # her numeric id: logins can change hands
    await save_policy(db, Admission(sources={"github": SourceAdmission(users=[alice])}))
    comment = github.comment(REPO, 1, "@superagent please fix")
    issue = {"number": 1, "title": "Flaky test", "html_url": "https://github.com/acme/app/issues/1"}
    body = json.dumps(
        {
            "action": "created",
            "issue": issue,
            "comment": comment,
            "repository": {"full_name": REPO},
            "sender": comment["user"],
        }
    ).encode()
    settings = Settings(github=GithubSettings(webhook_secret=SecretStr(SECRET)))
    state = AppState(settings=settings, pool=pool, replica_id="t", intake=Intake(pool))
    transport = httpx.ASGITransport(app=create_app(state))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        response = await http.post(
            "/webhooks/github",
            content=body,
            headers={
                "X-GitHub-Event": "issue_comment",
                "X-GitHub-Delivery": "d-ack",
                "X-Hub-Signature-256": sign(SECRET.encode(), body),
            },
        )
    assert response.status_code == 202, response.text
    assert response.json()["triggers"][0]["verdict"] == "explicit"
    row = await pool.fetchrow(
        "SELECT id, key, payload FROM effects WHERE kind = $1", EffectKind.ACKNOWLEDGE
    )
    assert row is not None
    assert row["payload"]["message_ref"] == f"issue_comment:{comment['id']}"

    acknowledge = acknowledge_handler(pool, Channels([adapter]))
    await acknowledge(_effect(EffectKind.ACKNOWLEDGE, row["payload"]))
    assert [r["content"] for r in github.reactions("issue_comment", comment["id"])] == ["eyes"]
