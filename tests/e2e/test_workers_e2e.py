"""From a GitHub comment to a pull request, through every real part.

A real `superagent serve` (its own process, real Postgres), a real endpointd paired over
real gRPC with TLS, a real git server (smart HTTPS behind basic auth, its certificate from
a test CA the device's git trusts) whose password only endpointd's keyring holds, the fake
GitHub API over real HTTP, and the fake OpenAI server playing both models:

1. a signed ``issue_comment`` webhook asks to fix a failing test in a small git repository;
2. the router creates a ticket on the device;
3. the worker runs the tests (they fail), patches the file, reruns them (they pass),
   commits, pushes a branch with the brokered credential, opens a pull request, and
   reports ready;
4. the router replies on the issue with the link, and the reply states tokens and cost.

The same flow runs two more ways: with the device offline from the middle of the task
(the ticket waits in ``waiting_device``, the issue is told once, the work resumes by
itself on reconnect), and with the control plane SIGKILLed after the pull request was
opened (a new process resumes the worker; no second pull request, no second comment).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.workers.worker import RECOVERY_NOTE
from superagent_shared import branches
from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer, Reply, ToolCall
from tests.support import github_examples
from tests.support.e2e_world import (
    CREDENTIAL,
    DEVICE,
    REPO,
    World,
    git,
    pending,
    running_world,
    start,
    webhook,
)
from tests.support.helpers import assert_eventually

PLAINTEXT_KEYRING = "keyrings.alt.file.PlaintextKeyring"
CALC_BROKEN = "def add(a, b):\n    return a - b\n"
TEST_CALC = (
    "import unittest\n\nfrom calc import add\n\n\n"
    "class AddTest(unittest.TestCase):\n"
    "    def test_adds(self):\n        self.assertEqual(add(2, 3), 5)\n\n\n"
    'if __name__ == "__main__":\n    unittest.main()\n'
)
FIX = (
    "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n"
    "-    return a - b\n+    return a + b\n"
)


def _comment_payload(comment_id: int, body: str, login: str) -> dict[str, Any]:
    """An issue_comment.created delivery: GitHub's own example, pointed at our repository,
    issue and text."""
    payload = github_examples.example("issue_comment", "created")
    payload["repository"]["full_name"] = REPO
    payload["issue"]["number"] = 1
    payload["issue"]["title"] = "calc: add() is broken"
    payload["issue"]["html_url"] = f"https://github.com/{REPO}/issues/1"
    payload["comment"]["id"] = comment_id
    payload["comment"]["body"] = body
    payload["comment"]["user"]["login"] = login
    payload["sender"]["login"] = login
    # Whoever the recorded example was, the comment is by this login's account.
    payload["comment"]["user"]["id"] = payload["sender"]["id"] = _user_id(login)
    return payload


def _user_id(login: str) -> int:
    """The GitHub numeric user id of ``login``'s account in these tests."""
    return {"alice": 1001}.get(login, 9999)


# ------------------------------------------------------------------------------ the models


@dataclass
class Script:
    """Both models: the router creates the ticket and relays the report; the worker does
    the job step by step, deciding from what its conversation shows (so a resumed session
    picks up where the work really is)."""

    workdir: Path
    python: str = sys.executable
    # Called (in the fake server's thread) just before the worker is told to do a step.
    before_step: dict[str, Any] = field(default_factory=dict)
    steps_told: list[str] = field(default_factory=list)

    def __call__(self, request: ChatRequest) -> Reply:
        if (request.system_prompt() or "").startswith("You are the router"):
            return self.route(request)
        return self.work(request)

    def route(self, request: ChatRequest) -> Reply:
        batch = request.last_user_message() or ""
        if request.last_message() and request.last_message().get("role") == "tool":  # type: ignore[union-attr]
            return Reply(content="done")
        calls: list[ToolCall] = []
        thread = None
        for line in batch.splitlines():
            if found := re.match(r"thread (thr_\w+)", line):
                thread = found[1]
            if found := re.search(r"\[(trg_\w+)\] explicit issue_comment", line):
                calls.append(
                    ToolCall(
                        "create_ticket",
                        {
                            "title": "Fix the failing calc test",
                            "scope": "make test_calc pass; open a pull request",
                            "threads": [thread],
                            "device": DEVICE,
                            "mandate_from": found[1],
                            "workdir": str(self.workdir),
                        },
                    )
                )
            if "report.ready" in line and (pr := re.search(r"pull request (\S+)", line)):
                calls.append(
                    ToolCall(
                        "reply",
                        {
                            "thread": thread,
                            "text": f"Fixed: `add()` subtracted. Pull request: {pr[1]}",
                        },
                    )
                )
        return Reply(tool_calls=calls) if calls else Reply(content="nothing to do")

    def work(self, request: ChatRequest) -> Reply:
        brief = request.messages[1]["content"]
        branch = re.search(r"Branch: (\S+)", brief)
        assert branch is not None
        last = request.messages[-1]
        results = [m for m in request.messages if m.get("role") in ("tool", "user")]
        done = 0
        for message in results[1:]:  # results and events after the brief
            content = str(message.get("content") or "")
            if message["role"] == "tool":
                finished = '"exit_code"' in content or '"applied": true' in content
                finished = finished or '"pull_request": "http' in content
                done += 1 if finished else 0
            else:
                done += content.count('"type": "job_ended"')
        if last["role"] == "tool" and pending(str(last.get("content"))):
            return Reply(content="waiting for the job")  # its result arrives as an event
        recovering = last["role"] == "user" and last["content"] == RECOVERY_NOTE
        test = f"{self.python} -m unittest -q test_calc"
        steps: list[tuple[str, ToolCall]] = [
            ("test-fails", ToolCall("shell", {"command": test})),
            ("patch", ToolCall("apply_patch", {"patch": FIX})),
            ("test-passes", ToolCall("shell", {"command": test})),
            (
                "commit",
                ToolCall(
                    "shell",
                    {
                        "command": f"git checkout -q -B {branch[1]} && git add -A && git -c "
                        "user.name=Super-agent -c user.email=agent@example.com commit -qm "
                        "'Fix add()'"
                    },
                ),
            ),
            (
                # One program and its arguments (no `cd … &&`): the device gives the credential
                # to the program it really runs, which must be git, in the ticket's workspace.
                "push",
                ToolCall(
                    "shell",
                    {
                        "command": f"git push -q origin HEAD:refs/heads/{branch[1]}",
                        "credentials": [{"name": CREDENTIAL, "delivery": "git_helper"}],
                    },
                ),
            ),
            (
                "pull-request",
                ToolCall(
                    "open_pull_request",
                    {"title": "Fix add()", "body": "add() subtracted.", "head": branch[1]},
                ),
            ),
        ]
        if recovering:  # check before repeating: the pull request may exist already
            name, call = steps[-1]
        elif done < len(steps):
            name, call = steps[done]
        else:
            pr = next(
                json.loads(m["content"])["pull_request"]
                for m in reversed(request.messages)
                if m.get("role") == "tool" and '"pull_request": "http' in m["content"]
            )
            name = "report"
            call = ToolCall(
                "report", {"status": "ready", "summary": "add() fixed; tests pass", "pr_url": pr}
            )
        self.steps_told.append(name)
        hook = self.before_step.pop(name, None)
        if hook is not None:
            hook()
        return Reply(tool_calls=[call])


# ---------------------------------------------------------------------------- the world


@pytest.fixture
def world(tmp_path: Path, database_url: str, fake_llm: FakeOpenAIServer) -> Iterator[World]:
    files = {"calc.py": CALC_BROKEN, "test_calc.py": TEST_CALC}
    with running_world(
        tmp_path, database_url, fake_llm, files=files, script=lambda w: Script(w.workdir)
    ) as world:
        world.github.open_issue(REPO, "calc: add() is broken", "test_calc fails")
        yield world


async def _ask(world: World, comment_id: int) -> None:
    """The signed webhook GitHub sends for a new comment on issue #1."""
    payload = _comment_payload(comment_id, "@superagent test_calc fails, please fix it", "alice")
    await webhook(world, "issue_comment", payload, f"delivery-{comment_id}")


def _agent_comments(world: World) -> list[str]:
    return [str(c["body"]) for c in world.github.comments(REPO, 1) if c["user"]["login"] != "alice"]


async def _ticket(pool: asyncpg.Pool) -> asyncpg.Record:
    row = await pool.fetchrow(
        "SELECT t.* FROM tickets t JOIN devices d ON d.id = t.device_id "
        "WHERE d.name = $1 AND d.revoked_at IS NULL ORDER BY t.created_at DESC LIMIT 1",
        DEVICE,
    )
    assert row is not None
    return row


async def _finished(world: World, pool: asyncpg.Pool) -> tuple[asyncpg.Record, str]:
    """Wait for the pull request and the reply; check what the work left behind."""

    def replied() -> list[str]:
        found = [c for c in _agent_comments(world) if "Pull request:" in c]
        assert found, f"no reply yet; comments: {_agent_comments(world)}"
        return found

    (reply,) = await assert_eventually(
        replied,
        timeout=90,
        interval=0.3,
        message="the router's reply with the pull request",
    )
    ticket = await _ticket(pool)
    assert ticket["state"] == "ready"  # waiting for the merge
    (pr,) = world.github.pulls(REPO)
    assert pr["html_url"] == ticket["pr_url"]
    assert pr["head"]["ref"] == ticket["branch"] == branches.ticket_branch(ticket["id"])
    assert ticket["pr_url"] in reply
    assert "tokens" in reply
    assert "$" in reply
    # The branch really reached the origin, with the fix, through the brokered credential.
    pushed = git("show", f"{ticket['branch']}:calc.py", cwd=world.bare)
    assert "return a + b" in pushed
    assert world.git.pushes >= 1
    # The credentialed push ran git itself (what the device's scope names), not a shell.
    pushes = await pool.fetch(
        "SELECT spec FROM commands WHERE ticket_id = $1 AND kind = 'exec' "
        "AND jsonb_array_length(spec->'credentials') > 0",
        ticket["id"],
    )
    assert pushes, "no credentialed command"
    for row in pushes:
        spec = json.loads(row["spec"]) if isinstance(row["spec"], str) else row["spec"]
        assert spec["argv"][:2] == ["git", "push"], spec["argv"]
    steps = world.script.steps_told
    assert steps[:3] == ["test-fails", "patch", "test-passes"], steps
    # The work happened in the ticket's own worktree: the owner's checkout is as it was.
    assert ticket["workspace"]
    assert ticket["workspace"] != str(world.workdir)
    assert git("status", "--porcelain", cwd=world.workdir) == ""
    assert git("rev-parse", "--abbrev-ref", "HEAD", cwd=world.workdir).strip() == "main"
    assert "return a - b" in (world.workdir / "calc.py").read_text()
    return ticket, reply


async def _start(world: World, pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession]) -> None:
    await start(world, pool, db)


async def test_a_comment_becomes_a_pull_request(
    world: World, pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession]
) -> None:
    await _start(world, pool, db)
    await _ask(world, 9001)
    ticket, _ = await _finished(world, pool)
    # The test run failed first, then passed: the worker saw both for real.
    results = await pool.fetch(
        "SELECT c.exit_code FROM jobs j JOIN commands c ON c.id = j.command_id "
        "WHERE j.ticket_id = $1 ORDER BY c.seq",
        ticket["id"],
    )
    assert [r["exit_code"] for r in results][:2] == [1, 0]
    assert len(_agent_comments(world)) == 1


async def test_the_ticket_waits_for_an_offline_device_and_resumes(
    world: World, pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession]
) -> None:
    await _start(world, pool, db)
    # Halfway: the laptop goes away just before the tests are rerun.
    world.script.before_step["test-passes"] = world.daemon.stop
    await _ask(world, 9002)

    async def waiting() -> asyncpg.Record:
        ticket = await _ticket(pool)
        assert ticket["state"] == "waiting_device", ticket["state"]
        return ticket

    ticket = await assert_eventually(waiting, timeout=60, interval=0.2, message="waiting")
    assert ticket["wait_until"] is not None
    notices = await assert_eventually(
        lambda: [c for c in _agent_comments(world) if "waiting for the device" in c],
        timeout=30,
        message="the issue is told",
    )
    assert len(notices) == 1
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM assignments WHERE ticket_id = $1 AND ended_at IS NULL",
            ticket["id"],
        )
        == 0
    )  # the slot is free while it waits
    world.daemon.start()
    await _finished(world, pool)
    assert len([c for c in _agent_comments(world) if "waiting for the device" in c]) == 1


async def test_a_killed_control_plane_resumes_without_duplicates(
    world: World, pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession]
) -> None:
    await _start(world, pool, db)
    # Right after the pull request was opened, before the worker reports: SIGKILL.
    world.script.before_step["report"] = world.replica.kill9
    await _ask(world, 9003)
    await assert_eventually(
        lambda: world.replica.process is not None and world.replica.process.poll() is not None,
        timeout=90,
        interval=0.2,
        message="killed after the pull request",
    )
    assert len(world.github.pulls(REPO)) == 1
    world.replica.start()
    ticket, _ = await _finished(world, pool)
    # The new process resumed the same session, told to check before repeating.
    sessions = await pool.fetch(
        "SELECT DISTINCT session_id FROM assignments WHERE ticket_id = $1", ticket["id"]
    )
    assert len(sessions) == 1
    assert RECOVERY_NOTE in [
        json.loads(r["content"])["message"].get("content")
        if isinstance(r["content"], str)
        else r["content"]["message"].get("content")
        for r in await pool.fetch(
            "SELECT content FROM session_messages WHERE session_id = $1",
            sessions[0]["session_id"],
        )
    ]
    assert len(world.github.pulls(REPO)) == 1
    await asyncio.sleep(2)  # a duplicate reply would have had time to go out
    assert len(_agent_comments(world)) == 1
