"""GitHub webhooks: signed deliveries become Triggers; bad ones get a clear 4xx, never a 500."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.api.app import create_app
from controlplane.channels.github import events
from controlplane.channels.github import routes as github_routes
from controlplane.channels.github.events import sign
from controlplane.ingest.admission import Admission, SourceAdmission
from controlplane.ingest.intake import IncomingTrigger, Ingested, Intake
from controlplane.settings import GithubSettings, Settings
from controlplane.web.state import AppState
from tests.support import github_examples
from tests.support.helpers import save_policy

SECRET = "whsec-test-4411"
REPO = {"full_name": "acme/app", "id": 1}
ALICE = {"login": "alice", "id": 101, "type": "User"}


def _client(
    pool: asyncpg.Pool,
    secret: str | None = SECRET,
    intake: Intake | None = None,
) -> httpx.AsyncClient:
    github = GithubSettings(
        webhook_secret=SecretStr(secret) if secret else None, agent_login="agent[bot]"
    )
    settings = Settings(github=github)
    state = AppState(settings=settings, pool=pool, replica_id="test", intake=intake or Intake(pool))
    transport = httpx.ASGITransport(app=create_app(state), raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://test")


async def _deliver(
    client: httpx.AsyncClient,
    event: str,
    payload: Any,
    *,
    delivery: str = "d-1",
    secret: str = SECRET,
    raw: bytes | None = None,
) -> httpx.Response:
    body = raw if raw is not None else json.dumps(payload).encode()
    return await client.post(
        "/webhooks/github",
        content=body,
        headers={
            "X-GitHub-Event": event,
            "X-GitHub-Delivery": delivery,
            "X-Hub-Signature-256": sign(secret.encode(), body),
            "Content-Type": "application/json",
        },
    )


def _comment(number: int = 7, body: str = "@superagent please fix", pr: bool = False) -> Any:
    issue: dict[str, Any] = {"number": number, "title": "Flaky test", "html_url": "https://x"}
    if pr:
        issue["pull_request"] = {"url": "https://x"}
    return {
        "action": "created",
        "issue": issue,
        "comment": {"id": 1, "body": body, "user": ALICE},
        "repository": REPO,
        "sender": ALICE,
    }


async def test_a_comment_becomes_a_trigger_once(pool: asyncpg.Pool) -> None:
    async with _client(pool) as client:
        first = await _deliver(client, "issue_comment", _comment())
        again = await _deliver(client, "issue_comment", _comment())  # GitHub's redelivery
    assert first.status_code == 202, first.text
    assert again.status_code == 202
    made = first.json()["triggers"]
    assert len(made) == 1
    assert again.json()["triggers"][0]["id"] == made[0]["id"]
    assert again.json()["triggers"][0]["duplicate"] is True
    row = await pool.fetchrow(
        "SELECT t.actor_name, t.text, t.kind, th.external_id FROM triggers t "
        "JOIN threads th ON th.id = t.thread_id"
    )
    assert row is not None
    assert (row["actor_name"], row["kind"], row["external_id"]) == (
        "alice",
        "issue_comment.created",
        "acme/app#7",
    )
    assert await pool.fetchval("SELECT count(*) FROM triggers") == 1


async def test_ci_results_and_reviews_land_on_the_pull_requests_thread(pool: asyncpg.Pool) -> None:
    check = {
        "action": "completed",
        "check_run": {
            "name": "tests",
            "conclusion": "failure",
            "pull_requests": [{"number": 7}, {"number": 9}],
        },
        "repository": REPO,
        "sender": {"login": "github-actions[bot]", "id": 5, "type": "Bot"},
    }
    review = {
        "action": "created",
        "pull_request": {"number": 7, "title": "Fix", "html_url": "https://x"},
        "comment": {"body": "rename this", "path": "a.py", "line": 3, "user": ALICE},
        "repository": REPO,
        "sender": ALICE,
    }
    async with _client(pool) as client:
        ci = await _deliver(client, "check_run", check, delivery="d-ci")
        commented = await _deliver(client, "pull_request_review_comment", review, delivery="d-r")
        opened = await _deliver(client, "issue_comment", _comment(7, pr=True), delivery="d-c")
    assert ci.status_code == commented.status_code == opened.status_code == 202
    threads = {t["thread"] for t in ci.json()["triggers"]}
    assert len(threads) == 2  # one trigger per pull request it ran for
    assert commented.json()["triggers"][0]["thread"] in threads
    assert opened.json()["triggers"][0]["thread"] == commented.json()["triggers"][0]["thread"]
    bot = await pool.fetchval(
        "SELECT actor_is_bot FROM triggers WHERE kind = 'check_run.completed' LIMIT 1"
    )
    assert bot is True


async def test_bad_deliveries_get_clear_errors_and_store_nothing(pool: asyncpg.Pool) -> None:
    async with _client(pool) as client:
        forged = await _deliver(client, "issue_comment", _comment(), secret="not-the-secret")
        assert forged.status_code == 401
        assert "X-Hub-Signature-256" in forged.json()["error"]["message"]
        unsigned = await client.post("/webhooks/github", content=b"{}")
        assert unsigned.status_code == 401
        no_event = await client.post(
            "/webhooks/github",
            content=b"{}",
            headers={"X-Hub-Signature-256": sign(SECRET.encode(), b"{}")},
        )
        assert no_event.status_code == 400
        not_json = await _deliver(client, "issue_comment", None, raw=b"<xml/>")
        assert not_json.status_code == 400
        too_deep = await _deliver(client, "issue_comment", None, raw=b"[" * 100_000)
        assert too_deep.status_code == 400  # the parser's recursion limit, not a 500
        broken = await _deliver(client, "issue_comment", {"action": "created", "repository": REPO})
        assert broken.status_code == 400
        assert "malformed issue_comment" in broken.json()["error"]["message"]
        # A user is its numeric id; a login alone names nobody for sure.
        no_id = _comment()
        no_id["comment"]["user"] = no_id["sender"] = {"login": "alice", "type": "User"}
        unidentified = await _deliver(client, "issue_comment", no_id, delivery="d-no-id")
        assert unidentified.status_code == 400
        assert "numeric id" in unidentified.json()["error"]["message"]
        ignored = await _deliver(client, "push", {"ref": "main", "repository": REPO})
        assert ignored.status_code == 200
        assert "push" in ignored.json()["ignored"]
    async with _client(pool, secret=None) as unconfigured:
        off = await _deliver(unconfigured, "issue_comment", _comment())
        assert off.status_code == 404
        assert "SUPERAGENT_GITHUB__WEBHOOK_SECRET" in off.json()["error"]["message"]
    assert await pool.fetchval("SELECT count(*) FROM triggers") == 0


async def test_oversized_bodies_are_refused_with_413_and_store_nothing(pool: asyncpg.Pool) -> None:
    big = b'{"pad": "' + b"x" * events.MAX_BODY + b'"}'

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: counted as it arrives
        for start in range(0, len(big), 1 << 20):
            yield big[start : start + (1 << 20)]

    async with _client(pool) as client:
        sized = await _deliver(client, "issue_comment", None, raw=big)
        streamed = await client.post(
            "/webhooks/github",
            content=chunked(),
            headers={
                "X-GitHub-Event": "issue_comment",
                "X-GitHub-Delivery": "d-big",
                "X-Hub-Signature-256": sign(SECRET.encode(), big),
            },
        )
    for response in (sized, streamed):
        assert response.status_code == 413, response.text
        assert "25 MB" in response.json()["error"]["message"]
    assert await pool.fetchval("SELECT count(*) FROM triggers") == 0


class StuckIntake(Intake):
    """A database that does not answer in time."""

    async def ingest(self, trigger: IncomingTrigger) -> Ingested:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_an_ingest_too_slow_for_github_answers_503_in_time(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(github_routes, "INGEST_BUDGET", 0.2)
    async with _client(pool, intake=StuckIntake(pool)) as client:
        response = await _deliver(client, "issue_comment", _comment(), delivery="d-slow")
    assert response.status_code == 503
    message = response.json()["error"]["message"]
    assert "d-slow" in message
    assert "redeliver" in message
    assert await pool.fetchval("SELECT count(*) FROM triggers") == 0


async def test_explicit_requests_get_an_acknowledge_effect_on_what_asked(
    pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession]
) -> None:
    # Allowlisted by her numeric user id: logins can be renamed and registered again.
    await save_policy(db, Admission(sources={"github": SourceAdmission(users=[str(ALICE["id"])])}))
    opened = {
        "action": "opened",
        "issue": {"number": 8, "title": "@superagent add a flag", "body": "", "html_url": "x"},
        "repository": REPO,
        "sender": ALICE,
    }
    review = {
        "action": "created",
        "pull_request": {"number": 9, "title": "Fix", "html_url": "https://x"},
        "comment": {"id": 55, "body": "@superagent rename", "path": "a.py", "user": ALICE},
        "repository": REPO,
        "sender": ALICE,
    }
    bob = {"login": "bob", "id": 102, "type": "User"}
    not_allowed = _comment(body="@superagent do it")
    not_allowed["comment"] = {"id": 2, "body": "@superagent do it", "user": bob}
    async with _client(pool) as client:
        for event, payload, delivery in (
            ("issue_comment", _comment(), "d-1"),
            ("issues", opened, "d-2"),
            ("pull_request_review_comment", review, "d-3"),
            ("issue_comment", not_allowed, "d-4"),
        ):
            response = await _deliver(client, event, payload, delivery=delivery)
            assert response.status_code == 202, response.text
    rows = await pool.fetch("SELECT payload FROM effects WHERE kind = 'acknowledge'")
    assert sorted(
        (r["payload"]["message_ref"], r["payload"]["thread_external_id"]) for r in rows
    ) == [
        ("issue:8", "acme/app#8"),
        ("issue_comment:1", "acme/app#7"),
        ("pull_request_review_comment:55", "acme/app#9"),
    ]  # bob is not allowlisted: recorded, not acknowledged
    assert await pool.fetchval("SELECT count(*) FROM triggers") == 4


async def test_the_agents_own_comments_are_not_triggers(pool: asyncpg.Pool) -> None:
    own = _comment(body="Done: see the PR.\n\n<!-- superagent:rpl_1 -->")
    agent = {"login": "agent[bot]", "id": 9, "type": "Bot"}
    own["comment"]["user"] = own["sender"] = agent
    async with _client(pool) as client:
        response = await _deliver(client, "issue_comment", own)
    assert response.status_code == 200
    assert "own comment" in response.json()["ignored"]
    assert await pool.fetchval("SELECT count(*) FROM triggers") == 0


async def test_every_real_github_payload_is_a_trigger_or_a_deliberate_ignore(
    pool: asyncpg.Pool,
) -> None:
    files = github_examples.examples()
    assert len(files) > 300  # every event GitHub documents, not a chosen few
    outcomes: dict[str, int] = {}
    async with _client(pool) as client:
        for n, (name, body) in enumerate(files):
            event = name.split(".")[0]
            response = await _deliver(client, event, None, raw=body, delivery=f"fixture-{n}")
            assert response.status_code in (200, 202), (name, response.text)
            outcomes[name] = response.status_code
            if response.status_code == 202:
                assert response.json()["triggers"], name
    made = sum(1 for status in outcomes.values() if status == 202)
    # The comment, issue, PR, review and CI events among them are recorded.
    assert made >= 40, outcomes
    assert all(
        outcomes[name] == 202
        for name in outcomes
        if name.startswith(("issue_comment.created", "pull_request_review_comment.created"))
    )
