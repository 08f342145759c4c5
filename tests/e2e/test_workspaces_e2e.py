"""Two tickets on one laptop, each in its own worktree, through the whole PR lifecycle.

Every real part (tests/support/e2e_world.py): `superagent serve`, endpointd over gRPC with
TLS, the git server, the GitHub fake over HTTP and the scripted model. The owner's own
checkout of the repository carries unfinished work (a modified file, a staged new file, a
stash) the whole time.

1. Two requests on two issues of the same repository: two tickets run at once on the one
   device, each in its own worktree on its own branch, and each opens its own PR.
2. The owner's checkout is byte for byte as it was: the file, the index, the stash list.
3. A review comment on the first PR wakes its worker, which pushes a new commit to the
   same PR (and opens no second one).
4. A failing CI run on the second PR wakes its worker, which pushes a fix commit; after
   three automatic fix rounds, the fourth failure ends blocked, naming the check.
5. Merging the first PR completes its ticket, and the device prunes its workspace.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from superagent_shared import branches
from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer, Reply, ToolCall
from tests.support.e2e_world import (
    ALICE,
    CREDENTIAL,
    DEVICE,
    REPO,
    World,
    git,
    pending,
    router_lines,
    running_world,
    start,
    webhook,
)
from tests.support.helpers import assert_eventually

CALC = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a + b\n"
TESTS = (
    "import unittest\n\nfrom calc import add, sub\n\n\n"
    "class CalcTest(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
    "    def test_sub(self):\n        self.assertEqual(sub(3, 2), 1)\n"
)
FIXES = {
    "add": "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n"
    "-    return a - b\n+    return a + b\n",
    "sub": "--- a/calc.py\n+++ b/calc.py\n@@ -5,2 +5,2 @@\n def sub(a, b):\n"
    "-    return a + b\n+    return a - b\n",
}
INSTRUCTIONS = "Run `python -m unittest` before every commit.\n"
ALICE_USER = {"login": "alice", "id": ALICE, "type": "User"}
CI_BOT = {"login": "github-actions[bot]", "id": 41898282, "type": "Bot"}
# The device removes a released workspace at once, so the test sees it go.
POLICY = "\n[workspaces]\nretention_hours = 0\n"


@dataclass
class Script:
    """Both models. The worker's plan depends on what woke it (the request, a review, a CI
    failure) and how far its conversation shows it got since."""

    python: str
    told: list[tuple[str, str]] = field(default_factory=list)  # (ticket, step)
    briefs: dict[str, str] = field(default_factory=dict)  # ticket -> its brief

    def __call__(self, request: ChatRequest) -> Reply:
        if (request.system_prompt() or "").startswith("You are the router"):
            return self.route(request)
        return self.work(request)

    def route(self, request: ChatRequest) -> Reply:
        lines = router_lines(request)
        if lines is None:
            return Reply(content="done")
        calls: list[ToolCall] = []
        for thread, line in lines:
            found = re.search(r"\[(trg_\w+)\] explicit issue_comment", line)
            if found and (fn := re.search(r"fix (add|sub)\(\)", line)):
                calls.append(
                    ToolCall(
                        "create_ticket",
                        {
                            "title": f"Fix {fn[1]}()",
                            "scope": f"make test_{fn[1]} pass; open a pull request",
                            "threads": [thread],
                            "device": DEVICE,
                            "mandate_from": found[1],
                        },
                    )
                )
        return Reply(tool_calls=calls) if calls else Reply(content="nothing to do")

    def work(self, request: ChatRequest) -> Reply:
        brief = str(request.messages[1]["content"])
        ticket = re.search(r"Ticket (tkt_\w+)", brief)
        branch = re.search(r"Branch: (\S+)", brief)
        fn = re.search(r"Fix (add|sub)\(\)", brief)
        assert ticket, brief
        assert branch, brief
        assert fn, brief
        last = request.messages[-1]
        if last["role"] == "tool" and pending(str(last.get("content"))):
            return Reply(content="waiting for the job")  # its result arrives as an event
        # What woke this round: the last event, and the steps done since.
        since = 0
        woke = ""
        for message in request.messages[2:]:
            content = str(message.get("content") or "")
            if message["role"] == "user" and '"type": "event"' in content:
                woke, since = content, 0
            elif message["role"] == "tool":
                done = '"exit_code"' in content or '"applied": true' in content
                since += 1 if done or '"pull_request": "http' in content else 0
            elif message["role"] == "user":
                since += content.count('"type": "job_ended"')
        commit = (
            "git add -A && git -c user.name=Super-agent -c user.email=agent@example.com commit -qm"
        )
        push = ToolCall(
            "shell",
            {
                "command": f"git push -q origin HEAD:refs/heads/{branch[1]}",
                "credentials": [{"name": CREDENTIAL, "delivery": "git_helper"}],
            },
        )
        append = f"{self.python} -c \"open('calc.py', 'a').write('# %s\\n')\""
        ready = ToolCall("report", {"status": "ready", "summary": "done"})
        steps: list[tuple[str, ToolCall]]
        if "review" in woke:
            steps = [
                ("review-edit", ToolCall("shell", {"command": append % "reviewed"})),
                ("review-commit", ToolCall("shell", {"command": f"{commit} 'Address review'"})),
                ("review-push", push),
                ("review-ready", ready),
            ]
        elif "failure" in woke:
            steps = [
                ("ci-edit", ToolCall("shell", {"command": append % "ci"})),
                ("ci-commit", ToolCall("shell", {"command": f"{commit} 'Fix CI'"})),
                ("ci-push", push),
                ("ci-ready", ready),
            ]
        else:
            steps = [
                ("patch", ToolCall("apply_patch", {"patch": FIXES[fn[1]]})),
                ("commit", ToolCall("shell", {"command": f"{commit} 'Fix {fn[1]}()'"})),
                ("push", push),
                (
                    "pull-request",
                    ToolCall(
                        "open_pull_request",
                        {"title": f"Fix {fn[1]}()", "body": "fixed", "head": branch[1]},
                    ),
                ),
                ("ready", ready),
            ]
        name, call = steps[min(since, len(steps) - 1)]
        self.told.append((ticket[1], name))
        self.briefs[ticket[1]] = brief
        return Reply(tool_calls=[call])


@pytest.fixture
def world(tmp_path: Path, database_url: str, fake_llm: FakeOpenAIServer) -> Iterator[World]:
    files = {
        "calc.py": CALC,
        "test_calc.py": TESTS,
        "README.md": "widgets\n",
        "AGENTS.md": INSTRUCTIONS,
        "docs/AGENTS.md": "Docs are in British English.\n",
    }
    with running_world(
        tmp_path, database_url, fake_llm, files=files, script=lambda _: Script(sys.executable)
    ) as world:
        world.github.open_issue(REPO, "add() is broken", "test_add fails")
        world.github.open_issue(REPO, "sub() is broken", "test_sub fails")
        yield world


def _repository() -> dict[str, Any]:
    # A private repository: what CI says there is not said in public.
    return {"full_name": REPO, "name": "widgets", "owner": {"login": "acme"}, "private": True}


def _comment(number: int, comment_id: int, body: str) -> dict[str, Any]:
    return {
        "action": "created",
        "issue": {
            "number": number,
            "title": f"issue {number}",
            "user": ALICE_USER,
            "state": "open",
            "html_url": f"https://github.com/{REPO}/issues/{number}",
        },
        "comment": {"id": comment_id, "body": body, "user": ALICE_USER},
        "repository": _repository(),
        "sender": ALICE_USER,
    }


def _pull(pr: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "number": pr["number"],
        "title": pr["title"],
        "html_url": pr["html_url"],
        "head": pr["head"],
        "base": pr["base"],
        "state": pr["state"],
        **extra,
    }


def _owner_state(checkout: Path) -> dict[str, str]:
    """What the owner's unfinished work is: every byte the tickets must leave alone."""
    return {
        "README.md": (checkout / "README.md").read_text(),
        "status": git("status", "--porcelain", cwd=checkout),
        "index": git("diff", "--cached", cwd=checkout),
        "stash": git("stash", "list", cwd=checkout),
        "head": git("rev-parse", "HEAD", cwd=checkout),
        "branch": git("rev-parse", "--abbrev-ref", "HEAD", cwd=checkout),
    }


async def _ticket(pool: asyncpg.Pool, fn: str) -> asyncpg.Record:
    row = await pool.fetchrow("SELECT * FROM tickets WHERE title = $1", f"Fix {fn}()")
    assert row is not None, f"no ticket for {fn}()"
    return row


async def _state(pool: asyncpg.Pool, fn: str, *states: str) -> asyncpg.Record:
    ticket = await _ticket(pool, fn)
    assert ticket["state"] in states, (ticket["state"], ticket["hold"])
    return ticket


async def _blocked(pool: asyncpg.Pool, fn: str) -> asyncpg.Record:
    ticket = await _state(pool, fn, "waiting_human")
    assert ticket["hold"] == "blocked", ticket["hold"]
    return ticket


def _is_dir(path: str | Path) -> bool:
    return os.path.isdir(path)


def _more_commits(world: World, branch: str, than: int) -> bool:
    return _pushed(world, branch) > than


def _pushed(world: World, branch: str) -> int:
    """Commits on ``branch`` at the origin."""
    return int(git("rev-list", "--count", branch, cwd=world.bare))


async def test_two_tickets_in_their_own_worktrees_through_review_ci_and_merge(
    world: World, pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession]
) -> None:
    checkout = world.workdir
    # The owner's unfinished work: a modified file, a staged new file, and a stash.
    (checkout / "notes.txt").write_text("stashed\n")
    git("add", "notes.txt", cwd=checkout)
    git("stash", "push", "-q", "-m", "owner's experiment", cwd=checkout)
    (checkout / "README.md").write_text("widgets, half rewritten by the owner\n")
    (checkout / "draft.py").write_text("x = 1\n")
    git("add", "draft.py", cwd=checkout)
    before = _owner_state(checkout)
    assert before["stash"]
    assert before["index"]
    assert " M README.md" in before["status"]

    await start(world, pool, db, policy=POLICY)
    await webhook(world, "issue_comment", _comment(1, 7001, "@superagent fix add() please"), "d1")
    await webhook(world, "issue_comment", _comment(2, 7002, "@superagent fix sub() please"), "d2")

    async def both_ready() -> tuple[asyncpg.Record, asyncpg.Record]:
        return await _state(pool, "add", "ready"), await _state(pool, "sub", "ready")

    add, sub = await assert_eventually(
        both_ready, timeout=180, interval=0.5, message="both tickets ready with a PR"
    )
    # Each in its own worktree, on its own branch, under endpointd's data dir.
    assert add["workspace"] != sub["workspace"]
    for ticket in (add, sub):
        workspace = Path(ticket["workspace"])
        assert _is_dir(workspace)
        assert world.data_dir in workspace.parents, workspace
        assert ticket["branch"] == branches.ticket_branch(ticket["id"])
        assert git("rev-parse", "--abbrev-ref", "HEAD", cwd=workspace).strip() == ticket["branch"]
    pulls = {p["head"]["ref"]: p for p in world.github.pulls(REPO)}
    assert set(pulls) == {add["branch"], sub["branch"]}
    assert "return a + b" in git("show", f"{add['branch']}:calc.py", cwd=world.bare)
    assert (
        "return a - b"
        in git("show", f"{sub['branch']}:calc.py", cwd=world.bare).split("def sub")[1]
    )
    # The owner's checkout is exactly as it was.
    assert _owner_state(checkout) == before
    # Each brief carries the repository's instructions from its own workspace, and names
    # the deeper ones.
    for ticket in (add, sub):
        brief = world.script.briefs[ticket["id"]]
        assert f"--- {ticket['workspace']}/AGENTS.md ---\n{INSTRUCTIONS}" in brief
        assert f"{ticket['workspace']}/docs/AGENTS.md" in brief

    # A review comment on the first PR: a new commit on the same PR, and no second PR.
    add_pr = pulls[add["branch"]]
    commits = _pushed(world, add["branch"])
    await webhook(
        world,
        "pull_request_review_comment",
        {
            "action": "created",
            "pull_request": _pull(add_pr),
            "comment": {
                "id": 8001,
                "body": "please mark this as reviewed",
                "path": "calc.py",
                "line": 2,
                "user": ALICE_USER,
            },
            "repository": _repository(),
            "sender": ALICE_USER,
        },
        "d3",
    )
    await assert_eventually(
        lambda: _pushed(world, add["branch"]) > commits,
        timeout=120,
        interval=0.5,
        message="a review commit on the same PR",
    )
    assert len(world.github.pulls(REPO)) == 2

    # CI fails on the second PR: each failure yields a fix commit, up to three rounds.
    sub_pr = pulls[sub["branch"]]
    for round_ in range(1, 5):
        await assert_eventually(
            lambda: _state(pool, "sub", "ready", "blocked"), timeout=120, interval=0.5
        )
        commits = _pushed(world, sub["branch"])
        await webhook(
            world,
            "check_run",
            {
                "action": "completed",
                "check_run": {
                    "id": 9000 + round_,
                    "name": "tests",
                    "status": "completed",
                    "conclusion": "failure",
                    "html_url": f"https://github.com/{REPO}/runs/{9000 + round_}",
                    "pull_requests": [{"number": sub_pr["number"]}],
                },
                "repository": _repository(),
                "sender": CI_BOT,
            },
            f"ci-{round_}",
        )
        if round_ <= 3:
            await assert_eventually(
                partial(_more_commits, world, sub["branch"], commits),
                timeout=120,
                interval=0.5,
                message=f"the fix commit of CI round {round_}",
            )
    blocked = await assert_eventually(
        lambda: _blocked(pool, "sub"), timeout=60, interval=0.5, message="blocked"
    )
    report = await pool.fetchval(
        "SELECT summary FROM reports WHERE ticket_id = $1 ORDER BY created_at DESC LIMIT 1",
        blocked["id"],
    )
    assert "tests" in str(report), report
    assert _pushed(world, sub["branch"]) == commits  # the fourth failure got no round

    # The merge completes the first ticket, and its workspace goes.
    await webhook(
        world,
        "pull_request",
        {
            "action": "closed",
            "number": add_pr["number"],
            "pull_request": _pull(add_pr, state="closed", merged=True),
            "repository": _repository(),
            "sender": ALICE_USER,
        },
        "d9",
    )
    await assert_eventually(
        lambda: _state(pool, "add", "completed"), timeout=60, interval=0.5, message="completed"
    )
    await assert_eventually(
        lambda: not Path(add["workspace"]).exists(),
        timeout=60,
        interval=0.5,
        message="the merged ticket's workspace is pruned",
    )
    assert _is_dir(sub["workspace"])  # the blocked one keeps its own
    assert _owner_state(checkout) == before
    told = json.dumps(world.script.told)
    assert "review-push" in told
    assert "ci-push" in told
