"""The pull request's lifecycle, to the end: reviews, CI, bots, the merge and the close.

A ticket delivers a pull request and waits in ``ready``; what happens on the pull request
wakes the same ticket's worker, which pushes to the same branch, answers review comments
in their threads, and never opens a second pull request. Failed CI wakes it up to
``workers.ci_fix_rounds_limit`` times, then the ticket ends blocked naming the check; bots
wake it at most ``workers.bot_rounds_limit`` rounds in a row; a person starts both counts
over. The merge completes the ticket, a close without a merge stops it.

Real Postgres, a real ``WorkerService`` and effect runner, a ``LocalDevice`` that runs git
for real against a bare repository on disk, the GitHub adapter against ``FakeGitHub`` (pull
requests opened and review threads answered over HTTP), GitHub's events through the real
webhook parser, and the fake OpenAI server as the worker's model.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import shlex
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from pydantic import SecretStr

from controlplane.channels.base import Channels, OutboundMessage
from controlplane.channels.github import events
from controlplane.channels.github.adapter import GithubAdapter
from controlplane.channels.github.auth import TokenAuth
from controlplane.channels.github.client import GithubClient
from controlplane.channels.github.pull_requests import open_pull_request_handler
from controlplane.channels.outbound import reply_handler
from controlplane.domain import EffectKind
from controlplane.effects import Handlers
from controlplane.effects.runner import EffectRunner
from controlplane.gateway.queue import CommandQueue
from controlplane.ingest.admission import WEB_CONSOLE_GROUP, Actor, Admission, SourceAdmission
from controlplane.ingest.intake import IncomingTrigger, Ingested, Intake, ThreadRef
from controlplane.settings import EffectsSettings, GithubSettings
from controlplane.tickets import pr_rounds
from superagent_shared.ids import new_id
from tests.fakes.github_server import FakeGitHub
from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer, Reply, ToolCall, message_text
from tests.support.helpers import assert_eventually, save_policy
from tests.support.worker_harness import (  # noqa: F401 - fixtures
    LocalDevice,
    Passes,
    dsn_fixture,
    file_ticket,
    local_device,
    queue_fixture,
    report_reply,
    state_is,
    ticket_state,
    tool_results,
    turn_of,
    workers_running,
)

REPO = "acme/widgets"
ALICE = {"login": "alice", "id": 1001, "type": "User"}  # allowlisted on GitHub
CAROL = {"login": "carol", "id": 1003, "type": "User"}  # allowlisted, merges and closes
REVIEW_BOT = {"login": "review-bot[bot]", "id": 7777, "type": "Bot"}
ACTIONS = {"login": "github-actions[bot]", "id": 41898282, "type": "Bot"}
WEB_ALICE = Actor("alice", "alice", groups=(WEB_CONSOLE_GROUP,))  # asks for every ticket here
FOREGROUND = 10  # seconds: git runs in the foreground here, never as a background job

_ids = itertools.count(50_000)


# -- GitHub's events, as the webhook route hands them in -----------------------------------


def _repository(private: bool) -> dict[str, Any]:
    return {"full_name": REPO, "private": private, "html_url": f"https://github.com/{REPO}"}


@dataclass
class PullRequest:
    number: int
    url: str
    private: bool

    def item(self, **extra: Any) -> dict[str, Any]:
        return {"number": self.number, "title": "Fix add()", "html_url": self.url, **extra}


# -- the worker's model --------------------------------------------------------------------


def _ticket_of(request: ChatRequest) -> str:
    found = re.match(r"Ticket (tkt_\w+):", message_text(request.messages[1]))
    assert found, request.messages[1]
    return found.group(1)


def _new_events(request: ChatRequest) -> list[dict[str, Any]]:
    """The channel events of the events message that woke this step (none if it was not)."""
    last = request.messages[-1]
    text = message_text(last)
    if last.get("role") != "user" or not text.startswith("Events since"):
        return []
    records = [json.loads(line) for line in text.splitlines()[1:]]
    return [r for r in records if r.get("type") == "event"]


def _push(workdir: Path, ticket_id: str, message: str) -> ToolCall:
    branch = f"superagent/{ticket_id}"
    command = (
        f"git checkout -q -B {branch} && git commit -q --allow-empty -m {shlex.quote(message)} "
        f"&& git push -q origin HEAD:refs/heads/{branch}"
    )
    return ToolCall("shell", {"command": command, "cwd": str(workdir)})


OPEN_PR = {"title": "Fix add()", "body": "add() adds now.", "repo": REPO}
WITH_AUTHORITY = ("allowlisted person", "allowlisted requester")


def worker(workdir: Path) -> Any:
    """The worker: pushes and opens the pull request; woken, answers each review comment in
    its thread, and for a person's review also pushes a fix and asks for the pull request
    again (which must give the same one); then reports ready."""

    def step(request: ChatRequest) -> Reply:
        ticket_id = _ticket_of(request)
        if turn_of(request) == 0:
            return Reply(
                tool_calls=[
                    _push(workdir, ticket_id, "fix add()"),
                    ToolCall("open_pull_request", OPEN_PR),
                ]
            )
        calls: list[ToolCall] = []
        for event in _new_events(request):
            if event["kind"] != "pull_request_review_comment.created":
                continue
            answer = f"Done ({event['trigger']})."
            calls.append(
                ToolCall("reply_to_comment", {"trigger": event["trigger"], "text": answer})
            )
            if event["authority"] in WITH_AUTHORITY:
                calls.append(_push(workdir, ticket_id, f"address {event['trigger']}"))
                calls.append(ToolCall("open_pull_request", OPEN_PR))
        if calls:
            return Reply(tool_calls=calls)
        # Each report says something new (the same call three times in a row is a loop).
        return report_reply("ready", f"ready after {len(request.messages)} messages")

    return step


# -- the scene -----------------------------------------------------------------------------


@dataclass
class World:
    pool: asyncpg.Pool
    queue: CommandQueue
    llm: FakeOpenAIServer
    dsn: str
    github: FakeGitHub
    device: LocalDevice
    origin: Path  # the bare repository pushes go to
    workdir: Path  # its clone on the device

    async def ticket(self) -> tuple[str, str]:
        """alice asks in the web chat; the ticket the router files (on her device).
        Returns (ticket id, its home thread)."""
        request = await Intake(self.pool).ingest(
            IncomingTrigger(
                source="web",
                external_id=new_id("msg"),
                thread=ThreadRef(f"chat-{new_id('msg')}"),
                actor=WEB_ALICE,
                kind="message",
                text="@superagent fix add() in acme/widgets",
                direct=True,
            )
        )
        ticket_id = await file_ticket(self.pool, request, self.device, title="fix add()")
        return ticket_id, request.thread_id

    async def delivered(self, ticket_id: str, *, private: bool = False) -> PullRequest:
        """The worker's first round: it pushes, opens the pull request, reports ready."""
        await assert_eventually(
            lambda: state_is(self.pool, ticket_id, "ready"), timeout=30, message="delivered"
        )
        (pull,) = self.github.pulls(REPO)
        url = await self.pool.fetchval("SELECT pr_url FROM tickets WHERE id = $1", ticket_id)
        assert url == pull["html_url"]
        return PullRequest(pull["number"], url, private)

    async def deliver(self, event: str, payload: dict[str, Any]) -> Ingested:
        made = events.to_triggers(event, str(uuid.uuid4()), payload, json.dumps(payload).encode())
        assert isinstance(made, list), made
        (trigger,) = made
        return await Intake(self.pool).ingest(trigger)

    async def review_comment(self, pr: PullRequest, user: dict[str, Any], body: str) -> Ingested:
        comment = self.github.review_comment(
            REPO,
            pr.number,
            body,
            user=self.github.user(str(user["login"]), bot=user["type"] == "Bot"),
        )
        comment["user"] = user  # the ids the policy knows them by
        return await self.deliver(
            "pull_request_review_comment",
            {
                "action": "created",
                "pull_request": pr.item(),
                "comment": comment,
                "repository": _repository(pr.private),
                "sender": user,
            },
        )

    async def ci(self, pr: PullRequest, conclusion: str, check: str = "tests") -> Ingested:
        run = {
            "name": check,
            "status": "completed",
            "conclusion": conclusion,
            "html_url": f"https://github.com/{REPO}/runs/{next(_ids)}",
            "pull_requests": [{"number": pr.number}],
        }
        return await self.deliver(
            "check_run",
            {
                "action": "completed",
                "check_run": run,
                "repository": _repository(pr.private),
                "sender": ACTIONS,
            },
        )

    async def closed(self, pr: PullRequest, *, merged: bool, title: str = "Fix add()") -> Ingested:
        return await self.deliver(
            "pull_request",
            {
                "action": "closed",
                "pull_request": {**pr.item(merged=merged), "title": title},
                "repository": _repository(pr.private),
                "sender": CAROL,
            },
        )

    async def rounds(self, ticket_id: str) -> list[asyncpg.Record]:
        return await self.pool.fetch(
            "SELECT woken_by, slot, outcome, session_id, ended_at FROM assignments "
            "WHERE ticket_id = $1 ORDER BY created_at",
            ticket_id,
        )

    async def rounds_over(self, ticket_id: str, count: int) -> list[asyncpg.Record]:
        async def over() -> list[asyncpg.Record] | None:
            rows = await self.rounds(ticket_id)
            done = len(rows) == count and all(r["ended_at"] is not None for r in rows)
            return rows if done else None

        found = await assert_eventually(over, timeout=30, message=f"{count} rounds over")
        assert isinstance(found, list)
        return found

    def commits(self, branch: str) -> int:
        out = subprocess.run(
            ["git", "rev-list", "--count", branch],
            cwd=self.origin,
            capture_output=True,
            text=True,
            check=True,
        )
        return int(out.stdout)


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    with FakeGitHub() as fake:
        fake.add_repo(REPO)
        yield fake


@pytest.fixture
async def world(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    github: FakeGitHub,
    tmp_path: Path,
) -> AsyncIterator[World]:
    """alice's repository on disk (a bare origin and its clone on her device), the policy
    (alice and carol allowlisted on GitHub), the outbox sending to ``FakeGitHub``, and the
    model answering as :func:`worker`."""
    origin, workdir = tmp_path / "origin.git", tmp_path / "widgets"
    _git(tmp_path, "init", "-q", "--bare", str(origin))
    _git(tmp_path, "clone", "-q", str(origin), str(workdir))
    _git(workdir, "config", "user.email", "alice@example.com")
    _git(workdir, "config", "user.name", "alice")
    _git(workdir, "commit", "-q", "--allow-empty", "-m", "start")
    _git(workdir, "push", "-q", "origin", "HEAD:refs/heads/main")
    await save_policy(
        pool,
        Admission(
            sources={
                "web": SourceAdmission(groups=[WEB_CONSOLE_GROUP]),
                "github": SourceAdmission(users=[str(ALICE["id"]), str(CAROL["id"])]),
            }
        ),
    )
    device = await local_device(pool, workdir)
    await device.online()
    settings = GithubSettings(token=SecretStr(github.pat), api_url=github.url)
    adapter = GithubAdapter(
        GithubClient(github.url, TokenAuth(github.pat)), Intake(pool), pool, settings
    )
    channels = Channels([adapter])
    handlers = Handlers()
    handlers.register(EffectKind.REPLY, reply_handler(pool, channels))
    handlers.register(EffectKind.OPEN_PULL_REQUEST, open_pull_request_handler(pool, channels))
    runner = EffectRunner(dsn, handlers, EffectsSettings(poll_interval_seconds=0.1), owner="test")
    await runner.start()
    fake_llm.respond_with(worker(workdir))
    try:
        yield World(pool, queue, fake_llm, dsn, github, device, origin, workdir)
    finally:
        fake_llm.respond_with(None)
        await runner.stop()
        await device.offline()
        await adapter.close()


def _tool_result(llm: FakeOpenAIServer, name: str) -> list[dict[str, Any]]:
    """Every result of tool ``name`` the worker sent back to the model, oldest first."""
    calls: dict[str, str] = {}
    results: dict[str, dict[str, Any]] = {}
    for request in llm.chat_requests:
        for message in request.messages:
            for call in message.get("tool_calls") or ():
                calls[call["id"]] = call["function"]["name"]
            if message.get("role") == "tool":
                results[message["tool_call_id"]] = json.loads(message["content"])
    return [result for ident, result in results.items() if calls.get(ident) == name]


# -- 1. reviews ----------------------------------------------------------------------------


async def test_a_review_comment_wakes_the_worker_which_answers_in_the_review_thread(
    world: World,
) -> None:
    """alice's review comment on the ticket's pull request wakes the same ticket: the worker
    pushes a fix to the same branch, its answer goes into the review comment's thread (not
    a new comment on the PR), and asking for the pull request again gives the same one,
    with nothing queued for GitHub."""
    ticket_id, _home = await world.ticket()
    branch = f"superagent/{ticket_id}"
    async with workers_running(
        world.pool, world.queue, world.llm, world.dsn, foreground_seconds=FOREGROUND
    ):
        pr = await world.delivered(ticket_id)
        assert world.commits(branch) == 2  # "start" and the fix
        review = await world.review_comment(pr, ALICE, "please rename x to total")
        assert review.tickets == (ticket_id,)
        first, woken = await world.rounds_over(ticket_id, 2)
        await assert_eventually(lambda: len(world.github.review_comments(REPO, pr.number)) == 2)
    assert await ticket_state(world.pool, ticket_id) == ("ready", None)
    assert (woken["woken_by"], woken["outcome"]) == ("human", "ready")
    assert woken["session_id"] == first["session_id"]  # same ticket, same session

    comment, answer = world.github.review_comments(REPO, pr.number)
    assert answer["in_reply_to_id"] == comment["id"]
    assert answer["body"].startswith(f"Done ({review.trigger_id}).")
    assert answer["user"]["login"] == world.github.pat_user["login"]
    assert world.github.comments(REPO, pr.number) == []  # not a comment on the PR itself
    replies = world.github.calls("POST", f"/pulls/{pr.number}/comments/{comment['id']}/replies")
    assert len(replies) == 1

    # The fix went to the same branch, hence the same pull request.
    assert world.commits(branch) == 3
    assert len(world.github.pulls(REPO)) == 1
    first_ask, second_ask = _tool_result(world.llm, "open_pull_request")
    assert first_ask["pull_request"] == pr.url
    assert second_ask["pull_request"] == pr.url
    assert second_ask["existing"] is True
    assert "nothing new was opened" in second_ask["note"]
    # One pull request asked of GitHub: a second effect would have looked it up again.
    pulls = f"/repos/{REPO}/pulls"
    assert [r.method for r in world.github.requests if r.path == pulls] == ["GET", "POST"]


# -- 2. CI -----------------------------------------------------------------------------------


async def test_failed_ci_wakes_the_worker_up_to_the_cap_then_the_ticket_is_blocked(
    world: World,
) -> None:
    """Three failed runs of 'tests' start three fix rounds (a passing run between them
    starts none and counts for nothing); the fourth ends the ticket blocked, with a report
    naming the check that reaches the router. A person's message then starts over."""
    ticket_id, home = await world.ticket()
    async with workers_running(
        world.pool, world.queue, world.llm, world.dsn, foreground_seconds=FOREGROUND
    ) as service:
        passes = Passes(service)
        pr = await world.delivered(ticket_id)
        failed = await world.ci(pr, "failure")
        assert failed.tickets == (ticket_id,)
        await world.rounds_over(ticket_id, 2)

        passed = await world.ci(pr, "success")
        assert passed.tickets == (ticket_id,)
        await passes.wait()
        assert len(await world.rounds(ticket_id)) == 2
        assert await _counts(world.pool, ticket_id) == (1, 0)

        await world.ci(pr, "timed_out")
        await world.rounds_over(ticket_id, 3)
        await world.ci(pr, "cancelled")
        await world.rounds_over(ticket_id, 4)
        assert await _counts(world.pool, ticket_id) == (3, 0)

        await world.ci(pr, "failure")
        await assert_eventually(lambda: state_is(world.pool, ticket_id, "waiting_human"))
        await passes.wait()
        assert await ticket_state(world.pool, ticket_id) == ("waiting_human", "blocked")
        assert len(await world.rounds(ticket_id)) == 4  # no fourth fix round
        summary = "CI check 'tests' failed 4 times; 3 automatic fix rounds used"
        report = await world.pool.fetchrow(
            "SELECT status, summary, trigger_id FROM reports WHERE ticket_id = $1 "
            "ORDER BY created_at DESC LIMIT 1",
            ticket_id,
        )
        assert report is not None
        assert (report["status"], report["summary"]) == ("blocked", summary)
        told = await world.pool.fetchrow(
            "SELECT kind, text, thread_id, route FROM triggers WHERE id = $1", report["trigger_id"]
        )
        assert told is not None
        assert (told["kind"], told["thread_id"], told["route"]) == (
            "report.blocked",
            home,
            "router",
        )
        assert summary in told["text"]

        # alice steps in: she wakes it, and the next failure is a fresh start.
        await Intake(world.pool).ingest(
            IncomingTrigger(
                source="web",
                external_id=new_id("msg"),
                thread=ThreadRef(await _external_id(world.pool, home)),
                actor=WEB_ALICE,
                kind="message",
                text="The flaky one is fixed on main now, try again.",
            )
        )
        await world.rounds_over(ticket_id, 5)
        await assert_eventually(lambda: state_is(world.pool, ticket_id, "ready"))
        await world.ci(pr, "failure")
        rounds = await world.rounds_over(ticket_id, 6)
    assert [r["woken_by"] for r in rounds] == ["new", "event", "event", "event", "human", "event"]
    assert await _counts(world.pool, ticket_id) == (1, 0)
    assert await ticket_state(world.pool, ticket_id) == ("ready", None)


async def _counts(pool: asyncpg.Pool, ticket_id: str) -> tuple[int, int]:
    row = await pool.fetchrow(
        "SELECT ci_fix_rounds, bot_rounds FROM tickets WHERE id = $1", ticket_id
    )
    assert row is not None
    return row["ci_fix_rounds"], row["bot_rounds"]


async def _external_id(pool: asyncpg.Pool, thread_id: str) -> str:
    return str(await pool.fetchval("SELECT external_id FROM threads WHERE id = $1", thread_id))


# -- 3. bots ---------------------------------------------------------------------------------


async def test_a_bot_ping_pong_stops_waking_the_worker_until_a_person_speaks(
    world: World,
) -> None:
    """A review bot and the worker answer each other: after bot_rounds_limit (3) rounds in
    a row the bot's next comments are kept but wake nobody, the ticket shows why and the
    thread is told once; alice's comment wakes it (it reads what waited) and starts over."""
    ticket_id, _home = await world.ticket()
    async with workers_running(
        world.pool, world.queue, world.llm, world.dsn, foreground_seconds=FOREGROUND
    ) as service:
        passes = Passes(service)
        pr = await world.delivered(ticket_id, private=True)
        for count in (2, 3, 4):
            await world.review_comment(pr, REVIEW_BOT, f"nit {count}: add a docstring")
            await world.rounds_over(ticket_id, count)
        assert await _counts(world.pool, ticket_id) == (0, 3)

        held = await world.review_comment(pr, REVIEW_BOT, "nit 5: and a type hint")
        await passes.wait()
        assert len(await world.rounds(ticket_id)) == 4
        assert await ticket_state(world.pool, ticket_id) == ("ready", pr_rounds.BOT_HOLD)
        await world.review_comment(pr, REVIEW_BOT, "nit 6: and a test")
        await passes.wait()
        assert len(await world.rounds(ticket_id)) == 4
        # Said once on the pull request, where the bot and the people are.
        (notice,) = await assert_eventually(lambda: _notices(world, pr))
        assert notice["body"].startswith(f"{ticket_id} stops answering bots here: 3 rounds")
        assert await world.pool.fetchval(
            "SELECT read_at IS NULL FROM ticket_inbox WHERE trigger_id = $1", held.trigger_id
        )

        person = await world.deliver(
            "issue_comment",
            {
                "action": "created",
                "issue": {**pr.item(), "pull_request": {"html_url": pr.url}},
                "comment": {"id": next(_ids), "body": "Bot's nits are fine, go on.", "user": ALICE},
                "repository": _repository(True),
                "sender": ALICE,
            },
        )
        assert person.tickets == (ticket_id,)
        rounds = await world.rounds_over(ticket_id, 5)
        assert rounds[-1]["woken_by"] == "human"
        assert await _counts(world.pool, ticket_id) == (0, 0)
        assert await ticket_state(world.pool, ticket_id) == ("ready", None)

        await world.review_comment(pr, REVIEW_BOT, "nit 7: one more")
        rounds = await world.rounds_over(ticket_id, 6)
    assert [r["woken_by"] for r in rounds] == ["new", *["event"] * 3, "human", "event"]
    assert len(_notices(world, pr)) == 1
    assert await _counts(world.pool, ticket_id) == (0, 1)
    woke = world.llm.chat_requests
    # The round alice woke read the bot's waiting comments with hers.
    shown = {e["trigger"] for r in woke for e in _new_events(r)}
    assert held.trigger_id in shown
    assert person.trigger_id in shown
    # Each round a bot started answered it in its review thread; the held ones waited for
    # alice's round, which answered them too.
    answers = await assert_eventually(
        lambda: _answers(world, pr) if len(_answers(world, pr)) == 6 else None
    )
    assert {a["body"].split(")")[0] for a in answers} == {
        f"Done ({trigger}" for trigger in _bot_comments(world.llm)
    }


def _notices(world: World, pr: PullRequest) -> list[dict[str, Any]]:
    return [c for c in world.github.comments(REPO, pr.number) if "answering bots" in c["body"]]


def _answers(world: World, pr: PullRequest) -> list[dict[str, Any]]:
    return [c for c in world.github.review_comments(REPO, pr.number) if c.get("in_reply_to_id")]


def _bot_comments(llm: FakeOpenAIServer) -> set[str]:
    """The review comments the worker was shown."""
    return {
        e["trigger"]
        for r in llm.chat_requests
        for e in _new_events(r)
        if e["kind"] == "pull_request_review_comment.created"
    }


# -- 4. the end ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("merged", "state", "hold"),
    [
        (True, "completed", "pull request merged"),
        (False, "stopped", "pull request closed without merge"),
    ],
    ids=["merged", "closed"],
)
async def test_the_merge_completes_the_ticket_and_a_close_without_merge_stops_it(
    world: World, monkeypatch: pytest.MonkeyPatch, merged: bool, state: str, hold: str
) -> None:
    """Without a round: the ticket ends, its device is told to release the workspace, and
    a stopped ticket's mandate is revoked."""
    ticket_id, _home = await world.ticket()
    async with workers_running(
        world.pool, world.queue, world.llm, world.dsn, foreground_seconds=FOREGROUND
    ) as service:
        pr = await world.delivered(ticket_id)
        # As if its device had prepared a workspace (this one predates them).
        await world.pool.execute(
            "UPDATE tickets SET workspace = '/w/ticket' WHERE id = $1", ticket_id
        )
        calls = len(world.llm.chat_requests)
        closed = await world.closed(pr, merged=merged)
        assert closed.tickets == (ticket_id,)
        await assert_eventually(lambda: state_is(world.pool, ticket_id, state, hold))
        await Passes(service).wait()
    assert len(world.llm.chat_requests) == calls
    assert len(await world.rounds(ticket_id)) == 1
    release = await world.pool.fetchrow(
        "SELECT c.spec, t.workspace_released_at FROM commands c JOIN tickets t "
        "ON t.id = c.ticket_id WHERE c.ticket_id = $1 AND c.kind = 'release_workspace'",
        ticket_id,
    )
    assert release is not None
    assert release["workspace_released_at"] is not None
    revoked = await world.pool.fetchval(
        "SELECT revoked_at IS NOT NULL FROM mandates WHERE ticket_id = $1", ticket_id
    )
    assert revoked is (not merged)


# -- the answer's way to GitHub --------------------------------------------------------------


async def test_an_answer_to_a_reply_joins_its_thread_once_and_a_lost_one_goes_to_the_pr(
    github: FakeGitHub, pool: asyncpg.Pool
) -> None:
    """GitHub takes no reply to a reply: the answer goes to the thread's top comment. A
    retry after a send that was not recorded finds it instead of posting again. A comment
    deleted meanwhile still gets its answer, on the pull request."""
    github.open_issue(REPO, "Fix add()", pull=True)
    top = github.review_comment(REPO, 1, "rename x", user=github.user("alice"))
    follow = github.review_comment(
        REPO, 1, "and y", user=github.user("carol"), in_reply_to=top["id"]
    )
    settings = GithubSettings(token=SecretStr(github.pat), api_url=github.url)
    adapter = GithubAdapter(
        GithubClient(github.url, TokenAuth(github.pat)), Intake(pool), pool, settings
    )
    try:
        answer = OutboundMessage(
            reply_id="msg_answer",
            thread_id="thr_pr",
            thread_external_id=f"{REPO}#1",
            text="Renamed both.",
            reply_to=f"pull_request_review_comment:{follow['id']}",
        )
        sent = await adapter.send(answer)
        again = await adapter.send(dataclasses.replace(answer, first_try=False))
        lost = await adapter.send(
            dataclasses.replace(
                answer, reply_id="msg_lost", reply_to="pull_request_review_comment:999999"
            )
        )
    finally:
        await adapter.close()
    (posted,) = [
        c for c in github.review_comments(REPO, 1) if c["id"] not in (top["id"], follow["id"])
    ]
    assert sent == again == f"pull_request_review_comment:{posted['id']}"
    assert posted["in_reply_to_id"] == top["id"]
    assert posted["body"].startswith("Renamed both.")
    (on_the_pr,) = github.comments(REPO, 1)
    assert lost == f"issue_comment:{on_the_pr['id']}"
    assert "msg_lost" in on_the_pr["body"]
