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
import os
import re
import secrets
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.channels.github.events import sign
from controlplane.gateway.tls import gateway_tls
from controlplane.ingest.policy import Policy, SourcePolicy
from controlplane.settings import Settings
from controlplane.workers.worker import RECOVERY_NOTE
from tests.fakes.endpointd_process import Endpointd, endpointd_in
from tests.fakes.git_server import GitServer
from tests.fakes.github_server import FakeGitHub
from tests.fakes.https_server import TestCA
from tests.fakes.openai_server import (
    FAKE_API_KEY,
    ChatRequest,
    FakeOpenAIServer,
    Reply,
    ToolCall,
)
from tests.support.gateway_harness import pairing_code
from tests.support.helpers import assert_eventually, free_port, save_policy
from tests.support.replica_process import ReplicaProcess

REPO = "acme/widgets"
DEVICE = "laptop"
CREDENTIAL = "widgets-push"
SECRET = "e2e-workers-webhook-secret"
AGENT = "octo-agent"
FIXTURES = Path(
    os.environ.get(
        "SUPERAGENT_GITHUB_FIXTURES",
        Path(__file__).resolve().parents[3] / "shared/fixtures/github-webhooks",
    )
)
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


def _git(*args: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env |= {"GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=30, check=True
    )
    return done.stdout


def _comment_payload(comment_id: int, body: str, login: str) -> dict[str, Any]:
    """An issue_comment.created delivery: the recorded example when the team's fixtures are
    there, else one of the same shape; pointed at our repository, issue and text."""
    path = FIXTURES / "issue_comment.created.0.json"
    if path.is_file():
        payload: dict[str, Any] = json.loads(path.read_text())
    else:
        user = {"login": login, "id": 1, "type": "User"}
        payload = {
            "action": "created",
            "issue": {"number": 1, "title": "", "user": user, "state": "open"},
            "comment": {"id": comment_id, "body": body, "user": user},
            "repository": {"full_name": REPO, "name": "widgets", "owner": {"login": "acme"}},
            "sender": user,
        }
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
        if last["role"] == "tool" and '"note"' in str(last.get("content")):
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
                # to the program it really runs, which must be git, in the ticket's directory.
                "push",
                ToolCall(
                    "shell",
                    {
                        "command": f"git push -q origin HEAD:refs/heads/{branch[1]}",
                        "cwd": str(self.workdir),
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


@dataclass
class World:
    github: FakeGitHub
    git: GitServer
    llm: FakeOpenAIServer
    daemon: Endpointd
    replica: ReplicaProcess
    script: Script
    workdir: Path
    bare: Path
    password: str
    grpc_port: int


@pytest.fixture
def world(tmp_path: Path, database_url: str, fake_llm: FakeOpenAIServer) -> Iterator[World]:
    # The repository: a failing test, cloned from a bare origin served over HTTPS.
    seed, served = tmp_path / "seed", tmp_path / "served"
    seed.mkdir()
    served.mkdir()
    (seed / "calc.py").write_text(CALC_BROKEN)
    (seed / "test_calc.py").write_text(TEST_CALC)
    _git("init", "-q", "-b", "main", cwd=seed)
    _git("add", "-A", cwd=seed)
    _git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "calc", cwd=seed)
    bare = served / "widgets.git"
    _git("clone", "-q", "--bare", str(seed), str(bare), cwd=tmp_path)
    password = "canary-push-" + secrets.token_hex(12)
    workdir = tmp_path / "work" / "widgets"
    # endpointd's git helper answers only https requests: the origin has a test CA's
    # certificate, which the device's commands trust through GIT_SSL_CAINFO (passed on to
    # them by the device's policy, see _pair_and_start).
    ca = TestCA(tmp_path / "test-ca")
    with (
        GitServer(served, password, ca=ca) as git,
        FakeGitHub() as github,
        endpointd_in(tmp_path) as daemon,
    ):
        workdir.parent.mkdir()
        _git("clone", "-q", str(bare), str(workdir), cwd=tmp_path)
        _git("remote", "set-url", "origin", git.url("widgets"), cwd=workdir)
        github.add_repo(REPO)
        github.open_issue(REPO, "calc: add() is broken", "test_calc fails")
        http_port, grpc_port = free_port(), free_port()
        state = tmp_path / "cp"
        env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "SUPERAGENT_STATE_DIR": str(state),
            "SUPERAGENT_HTTP__PORT": str(http_port),
            "SUPERAGENT_GRPC__PORT": str(grpc_port),
            "OPENAI_BASE_URL": fake_llm.url,
            "OPENAI_API_KEY": FAKE_API_KEY,
            "SUPERAGENT_GITHUB__TOKEN": github.pat,
            "SUPERAGENT_GITHUB__API_URL": github.url,
            "SUPERAGENT_GITHUB__WEBHOOK_SECRET": SECRET,
            "SUPERAGENT_GITHUB__AGENT_LOGIN": AGENT,
            "SUPERAGENT_ROUTER__LEASE_SECONDS": "3",
            "SUPERAGENT_ROUTER__RENEW_SECONDS": "1",
            "SUPERAGENT_WORKERS__LEASE_SECONDS": "4",
            "SUPERAGENT_WORKERS__RENEW_SECONDS": "1",
            # The device-away notice after a second rather than a minute.
            "SUPERAGENT_WORKERS__DEVICE_NOTICE_SECONDS": "1",
            "SUPERAGENT_WORKERS__PRICES__INPUT_USD_PER_MTOK": "2.5",
            "SUPERAGENT_WORKERS__PRICES__OUTPUT_USD_PER_MTOK": "10",
        }
        env.pop("SUPERAGENT_ADMIN_TOKEN", None)
        # The gateway's certificate, made now so endpointd can pin its fingerprint.
        gateway_tls(Settings(state_dir=state))
        replica = ReplicaProcess(env, tmp_path / "replica.log", http_port)
        script = Script(workdir)
        fake_llm.respond_with(script)
        daemon.env["PYTHON_KEYRING_BACKEND"] = PLAINTEXT_KEYRING
        daemon.env["XDG_DATA_HOME"] = str(tmp_path / "keyring-data")
        daemon.env["GIT_SSL_CAINFO"] = str(ca.ca_file)
        replica.start()
        try:
            yield World(
                github, git, fake_llm, daemon, replica, script, workdir, bare, password, grpc_port
            )
        finally:
            replica.stop()
            log = replica.log.read_text(errors="replace")
            assert password not in log, "the push credential reached the replica's log"
            assert password not in daemon.log(), "the push credential reached endpointd's log"
            fake_llm.assert_never_saw(password)
            github.assert_never_saw(password)


async def _pair_and_start(world: World, db: async_sessionmaker[AsyncSession]) -> None:
    daemon = world.daemon
    daemon.config_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    stored = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "endpointd", "creds", "add", CREDENTIAL],
        input=(world.password + "\n").encode(),
        capture_output=True,
        env=daemon.env,
        cwd=daemon.root,
        timeout=60,
    )
    assert stored.returncode == 0, stored.stderr.decode()
    # Alice's laptop: work goes only to a device its requester may use.
    code = await pairing_code(db, DEVICE, owner=f"github:{_user_id('alice')}")
    tls = gateway_tls(Settings(state_dir=Path(world.replica.env["SUPERAGENT_STATE_DIR"])))
    assert tls is not None
    paired = await asyncio.to_thread(
        daemon.pair, f"https://127.0.0.1:{world.grpc_port}", code, "--fingerprint", tls.fingerprint
    )
    assert paired.returncode == 0, paired.stdout + paired.stderr
    # The push may use the credential, for the origin's host only; nothing else may. Commands
    # get a minimal environment: the test CA's bundle is passed on by name.
    policy = daemon.config_dir / "policy.toml"
    text = _passing_env(policy.read_text(), "GIT_SSL_CAINFO")
    policy.write_text(
        text + f'\n[credentials.{CREDENTIAL}]\nallow = ["git push *"]\n'
        f"hosts = [{json.dumps(world.git.host)}]\n"
    )
    rules = tomllib.loads(policy.read_text())
    assert "GIT_SSL_CAINFO" in rules["env"]["pass"], rules.get("env")
    daemon.start()


def _passing_env(policy: str, name: str) -> str:
    """The policy text with ``name`` added to ``[env] pass``: the table that pairing wrote
    is edited, or one is added."""
    header = re.search(r"(?m)^\[env\][ \t]*$", policy)
    if header is None:
        return policy + f"\n[env]\npass = [{json.dumps(name)}]\n"
    end = re.search(r"(?m)^\[", policy[header.end() :])
    stop = header.end() + end.start() if end else len(policy)
    table = policy[header.end() : stop]
    existing = tomllib.loads("[env]" + table)["env"]
    line = f"pass = {json.dumps([*existing.get('pass', []), name])}"
    if "pass" in existing:
        table = re.sub(r"(?m)^pass\s*=\s*\[[^\]]*\]", line, table, count=1)
    else:
        table = "\n" + line + table
    return policy[: header.end()] + table + policy[stop:]


async def _connected(pool: asyncpg.Pool) -> bool:
    return bool(
        await pool.fetchval(
            "SELECT connected_replica IS NOT NULL FROM devices WHERE name = $1 "
            "AND revoked_at IS NULL",
            DEVICE,
        )
    )


async def _ask(world: World, comment_id: int) -> None:
    """The signed webhook GitHub sends for a new comment on issue #1."""
    body = json.dumps(
        _comment_payload(comment_id, "@superagent test_calc fails, please fix it", "alice")
    ).encode()
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{world.replica.url}/webhooks/github",
            content=body,
            headers={
                "X-GitHub-Event": "issue_comment",
                "X-GitHub-Delivery": f"delivery-{comment_id}",
                "X-Hub-Signature-256": sign(SECRET.encode(), body),
                "Content-Type": "application/json",
            },
        )
    assert response.status_code in (200, 202), response.text


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
    assert pr["head"]["ref"] == ticket["branch"] == f"superagent/{ticket['id']}"
    assert ticket["pr_url"] in reply
    assert "tokens" in reply
    assert "$" in reply
    # The branch really reached the origin, with the fix, through the brokered credential.
    pushed = _git("show", f"{ticket['branch']}:calc.py", cwd=world.bare)
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
    return ticket, reply


async def _start(world: World, pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession]) -> None:
    # Allowlisted by her numeric user id: a login can be renamed and registered again.
    alice = str(_user_id("alice"))
    await save_policy(db, Policy(sources={"github": SourcePolicy(users=[alice])}))
    await assert_eventually(world.replica.up, timeout=60, interval=0.2, message="replica up")
    await _pair_and_start(world, db)
    await assert_eventually(lambda: _connected(pool), timeout=30, message="endpointd connected")


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
