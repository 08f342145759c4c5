"""Polling GitHub: what is new becomes the triggers its webhook would make, exactly once,
across pages, restarts and rate limits, at the pace GitHub asks for."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import asyncpg
import pytest
from pydantic import SecretStr

from controlplane.channels import github as github_channel
from controlplane.channels.context import ChannelContext
from controlplane.channels.github.auth import TokenAuth
from controlplane.channels.github.client import GithubClient
from controlplane.channels.github.events import to_triggers
from controlplane.channels.github.receiver import GithubPoller, triggers_for
from controlplane.errors import TransientError
from controlplane.ingest.intake import IncomingTrigger, Ingested, Intake
from controlplane.settings import GithubSettings, Settings
from tests.fakes.github_server import FakeClock, FakeGitHub
from tests.support.github_fixtures import REPO, clock_fixture, github_fixture  # noqa: F401 - fixtures
from tests.support.helpers import assert_eventually

INTERVAL = 5.0


class CountingIntake(Intake):
    """The real intake, counting calls and new triggers; optionally dying after ``crash_after``
    calls (a replica killed mid-listing)."""

    def __init__(self, pool: asyncpg.Pool, crash_after: int | None = None) -> None:
        super().__init__(pool)
        self.calls = 0
        self.fresh = 0
        self.crash_after = crash_after

    async def ingest(self, trigger: IncomingTrigger) -> Ingested:
        if self.crash_after is not None and self.calls >= self.crash_after:
            raise RuntimeError("the replica died")
        self.calls += 1
        result = await super().ingest(trigger)
        self.fresh += not result.duplicate
        return result


Make = Callable[..., GithubPoller]


@pytest.fixture
async def make_poller(
    github: FakeGitHub, clock: FakeClock, pool: asyncpg.Pool
) -> AsyncIterator[Make]:
    """Pollers as separate replicas would build them: own client, own intake, one database."""
    clients: list[GithubClient] = []

    def make(
        intake: Intake | None = None,
        repos: tuple[str, ...] = (REPO,),
        cls: type[GithubPoller] = GithubPoller,
    ) -> GithubPoller:
        client = GithubClient(github.url, TokenAuth(github.pat), clock=clock)
        clients.append(client)
        return cls(
            client,
            intake or CountingIntake(pool),
            pool,
            list(repos),
            interval=INTERVAL,
            agent_login=github.pat_user["login"],
        )

    yield make
    for client in clients:
        await client.close()


async def _triggers(pool: asyncpg.Pool) -> set[tuple[str, str, str]]:
    rows = await pool.fetch(
        "SELECT t.external_id, t.kind, th.external_id AS thread "
        "FROM triggers t JOIN threads th ON th.id = t.thread_id"
    )
    return {(r["external_id"], r["kind"], r["thread"]) for r in rows}


async def _polled_then_commented(
    github: FakeGitHub, clock: FakeClock, pool: asyncpg.Pool, make_poller: Make
) -> tuple[GithubPoller, CountingIntake]:
    """A poller that began after issue #1 was opened, then a comment on it (news)."""
    github.open_issue(REPO, "Flaky test")
    clock.advance(120)
    intake = CountingIntake(pool)
    poller = make_poller(intake)
    await poller.poll_once()
    github.comment(REPO, 1, "@superagent please look")
    return poller, intake


async def test_new_comments_issues_and_review_comments_become_triggers(
    github: FakeGitHub, clock: FakeClock, pool: asyncpg.Pool, make_poller: Make
) -> None:
    alice, bob = github.user("alice"), github.user("bob")
    old = github.open_issue(REPO, "An old issue", user=alice)
    clock.advance(3600)
    poller = make_poller()
    assert await poller.poll_once() == INTERVAL  # polling begins: nothing is new yet
    assert await _triggers(pool) == set()

    clock.advance(5)
    issue = github.open_issue(REPO, "@superagent the build is red", user=alice)
    comment = github.comment(REPO, old["number"], "@superagent any news?", user=bob)
    pr = github.open_issue(REPO, "Fix the build", pull=True, user=bob)
    review = github.review_comment(REPO, pr["number"], "rename this", user=alice)
    github.comment(REPO, issue["number"], "On it.", user=github.pat_user)  # the agent's own
    clock.advance(5)
    await poller.poll_once()

    # The old issue is listed again (its comment updated it) but is not news itself.
    assert await _triggers(pool) == {
        (f"opened:{REPO}#2", "issues.opened", f"{REPO}#2"),
        (f"issue_comment:{comment['id']}", "issue_comment.created", f"{REPO}#1"),
        (f"opened:{REPO}#3", "pull_request.opened", f"{REPO}#3"),
        (
            f"pull_request_review_comment:{review['id']}",
            "pull_request_review_comment.created",
            f"{REPO}#3",
        ),
    }


def test_a_polled_comment_is_the_trigger_its_webhook_makes(github: FakeGitHub) -> None:
    github.open_issue(REPO, "Flaky test")
    comment = github.comment(REPO, 1, "@superagent please look")
    issue = {"number": 1, "title": "Flaky test", "html_url": "https://github.com/acme/app/issues/1"}
    delivery = {
        "action": "created",
        "issue": issue,
        "comment": comment,
        "repository": {"full_name": REPO},
        "sender": comment["user"],
    }
    body = json.dumps(delivery).encode()
    made = to_triggers("issue_comment", "delivery-1", delivery, body)
    assert isinstance(made, list)
    [hooked] = made
    [polled] = triggers_for("issue_comments", REPO, comment, datetime.now(UTC), None)
    same = ("external_id", "kind", "text", "actor", "ack_ref", "direct")
    assert [getattr(polled, f) for f in same] == [getattr(hooked, f) for f in same]
    assert polled.thread.external_id == hooked.thread.external_id == f"{REPO}#1"
    assert polled.ack_ref == f"issue_comment:{comment['id']}"


async def test_an_unchanged_listing_costs_a_304_and_no_ingest(
    github: FakeGitHub, clock: FakeClock, pool: asyncpg.Pool, make_poller: Make
) -> None:
    poller, intake = await _polled_then_commented(github, clock, pool, make_poller)
    clock.advance(1)
    await poller.poll_once()  # the comment
    await poller.poll_once()  # the cursor moved: new requests, what they list dedupes
    assert intake.fresh == 1

    calls, budget, seen = intake.calls, github.rate_remaining("pat"), len(github.requests)
    await poller.poll_once()
    quiet = github.requests[seen:]
    assert [r.status for r in quiet] == [304, 304, 304]
    assert all("if-none-match" in r.headers for r in quiet)
    assert intake.calls == calls  # nothing ingested
    assert github.rate_remaining("pat") == budget  # nothing spent

    # A restart (another replica, the same database) keeps the ETags.
    restarted = make_poller(CountingIntake(pool))
    seen = len(github.requests)
    await restarted.poll_once()
    assert [r.status for r in github.requests[seen:]] == [304, 304, 304]


class RecordingPoller(GithubPoller):
    waits: list[float]

    async def poll_once(self) -> float:
        wait = await super().poll_once()
        self.waits = [*getattr(self, "waits", []), wait]
        return wait


async def test_x_poll_interval_is_honoured(
    github: FakeGitHub, pool: asyncpg.Pool, make_poller: Make
) -> None:
    poller = make_poller()
    github.poll_interval = 120
    assert await poller.poll_once() == 120  # GitHub asks for longer than poll_seconds
    github.poll_interval = 2
    assert await poller.poll_once() == INTERVAL  # ours is longer

    # As a service: it waits what the round said, and still stops at once when asked.
    github.open_issue(REPO, "@superagent hello")
    github.poll_interval = 300
    service = make_poller(cls=RecordingPoller)
    assert isinstance(service, RecordingPoller)
    await service.start()
    try:
        await assert_eventually(lambda: getattr(service, "waits", None))
        assert service.waits == [300]
        assert await _triggers(pool) == {(f"opened:{REPO}#1", "issues.opened", f"{REPO}#1")}
    finally:
        await service.stop(timeout=5)
    assert service.task.done()
    assert not service.task.cancelled()


async def test_a_rate_limit_pauses_polling_until_it_resets(
    github: FakeGitHub, clock: FakeClock, pool: asyncpg.Pool, make_poller: Make
) -> None:
    poller, intake = await _polled_then_commented(github, clock, pool, make_poller)

    github.limit_rate(300)  # 403, X-RateLimit-Remaining: 0, X-RateLimit-Reset: now + 300
    assert 299 <= await poller.poll_once() <= 301
    asked = len(github.requests)
    assert 299 <= await poller.poll_once() <= 301  # not asked again before the reset
    assert len(github.requests) == asked
    assert intake.calls == 0

    clock.advance(301)
    await poller.poll_once()
    assert intake.fresh == 1

    github.limit_rate(45, status=429)  # a secondary limit: Retry-After
    assert await poller.poll_once() == 45


async def test_a_restart_mid_listing_neither_misses_nor_double_counts(
    github: FakeGitHub, clock: FakeClock, pool: asyncpg.Pool, make_poller: Make
) -> None:
    github.open_issue(REPO, "A busy issue")
    clock.advance(120)
    await make_poller().poll_once()  # polling begins
    ids = []
    for n in range(250):  # three pages of 100
        ids.append(github.comment(REPO, 1, f"comment {n}")["id"])
        clock.advance(1)

    with pytest.raises(RuntimeError, match="died"):
        await make_poller(CountingIntake(pool, crash_after=150)).poll_once()
    assert len(await _triggers(pool)) == 150

    again = CountingIntake(pool)
    await make_poller(again).poll_once()
    made = await _triggers(pool)
    assert {external for external, _, _ in made} == {f"issue_comment:{i}" for i in ids}
    assert again.fresh == 100
    pages = {r.query.get("page", "1") for r in github.calls("GET", "/issues/comments")}
    assert pages == {"1", "2", "3"}  # Link: rel="next" followed


async def test_a_failure_between_pages_resumes_after_the_last_saved_page(
    github: FakeGitHub, clock: FakeClock, pool: asyncpg.Pool, make_poller: Make
) -> None:
    github.open_issue(REPO, "A busy issue")
    clock.advance(120)
    await make_poller().poll_once()
    for n in range(230):
        github.comment(REPO, 1, f"comment {n}")
        clock.advance(1)
    github.fail(502, path="/issues/comments", after=1)  # page 2 fails
    with pytest.raises(TransientError):
        await make_poller().poll_once()
    assert len(await _triggers(pool)) == 100

    before = github.calls("GET", "/issues/comments")
    resumed = make_poller()
    await resumed.poll_once()
    assert len(await _triggers(pool)) == 230
    # It resumed from the saved cursor (less the overlap), not from the beginning.
    listed = github.calls("GET", "/issues/comments")[len(before) :]
    assert [r.query.get("page", "1") for r in listed] == ["1", "2"]
    assert listed[0].query["since"] > before[-1].query["since"]


async def test_one_odd_object_or_repository_does_not_stop_the_others(
    github: FakeGitHub, clock: FakeClock, pool: asyncpg.Pool, make_poller: Make
) -> None:
    github.open_issue(REPO, "Flaky test")
    clock.advance(120)
    poller = make_poller(repos=("acme/gone", REPO))  # the first is not visible: 404
    await poller.poll_once()
    github.comment(REPO, 1, "a NUL \x00 is refused by ingest")
    good = github.comment(REPO, 1, "@superagent still here")
    clock.advance(1)
    await poller.poll_once()
    assert {t[0] for t in await _triggers(pool)} == {f"issue_comment:{good['id']}"}


async def test_the_adapter_polls_only_when_repositories_are_listed(
    github: FakeGitHub, pool: asyncpg.Pool
) -> None:
    def ctx(settings: GithubSettings) -> ChannelContext:
        return ChannelContext(Settings(github=settings), pool, Intake(pool), "", "replica")

    assert github_channel.build_adapter(ctx(GithubSettings())) is None
    plain = github_channel.build_adapter(ctx(GithubSettings(token=SecretStr(github.pat))))
    assert plain is not None
    assert plain.leader_services() == []
    polling = github_channel.build_adapter(
        ctx(GithubSettings(token=SecretStr(github.pat), api_url=github.url, poll_repos=REPO))
    )
    assert polling is not None
    [make] = polling.leader_services()
    assert isinstance(make(), GithubPoller)
    await plain.close()
    await polling.close()
