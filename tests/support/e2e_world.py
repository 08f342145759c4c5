"""The whole product on one machine, for end-to-end tests of workers (test helper).

A real `superagent serve` (its own process, real Postgres), a real endpointd paired over
real gRPC with TLS, a real git server (smart HTTPS behind basic auth, its certificate from
a test CA the device's git trusts) whose password only endpointd's keyring holds, the fake
GitHub API over real HTTP, and the fake OpenAI server playing both models.

:func:`running_world` builds it around a small repository (``files``) served as
``acme/widgets.git`` and cloned into ``work/widgets`` (the owner's own checkout, which the
device reports); :func:`start` pairs the device and waits until it is connected;
:func:`webhook` sends a signed GitHub delivery.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.channels.github.events import sign
from controlplane.gateway.tls import gateway_tls
from controlplane.ingest.admission import Admission, SourceAdmission
from controlplane.settings import Settings
from endpointd.guard.view import HOME_TOOLCHAINS
from tests.fakes.endpointd_process import Endpointd, endpointd_in
from tests.fakes.git_server import GitServer
from tests.fakes.github_server import FakeGitHub
from tests.fakes.https_server import TestCA
from tests.fakes.openai_server import FAKE_API_KEY, ChatRequest, FakeOpenAIServer, Reply
from tests.support.gateway_harness import pairing_code
from tests.support.helpers import assert_eventually, free_port, save_policy
from tests.support.replica_process import ReplicaProcess

REPO = "acme/widgets"
DEVICE = "laptop"
CREDENTIAL = "widgets-push"
SECRET = "e2e-workers-webhook-secret"
AGENT = "octo-agent"
PLAINTEXT_KEYRING = "keyrings.alt.file.PlaintextKeyring"
ALICE = 1001  # the requester's GitHub user id


def git(*args: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env |= {"GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=30, check=True
    )
    return done.stdout


@dataclass
class World:
    github: FakeGitHub
    git: GitServer
    llm: FakeOpenAIServer
    daemon: Endpointd
    replica: ReplicaProcess
    workdir: Path  # the owner's own checkout
    bare: Path  # the origin's repository
    password: str  # the push credential, held only by endpointd's keyring
    grpc_port: int
    data_dir: Path  # endpointd's data dir (the ticket workspaces live beneath it)
    script: Any = None  # what plays both models (the test's own object)


@contextlib.contextmanager
def running_world(
    tmp_path: Path,
    database_url: str,
    fake_llm: FakeOpenAIServer,
    *,
    files: Mapping[str, str],
    script: Callable[[World], Callable[[ChatRequest], Reply]],
    env: Mapping[str, str] | None = None,
) -> Iterator[World]:
    """The product around a repository holding ``files``; ``script(world)`` plays both
    models. On the way out, the push credential must not be in any log or request."""
    seed, served = tmp_path / "seed", tmp_path / "served"
    seed.mkdir()
    served.mkdir()
    for name, text in files.items():
        (seed / name).parent.mkdir(parents=True, exist_ok=True)
        (seed / name).write_text(text)
    git("init", "-q", "-b", "main", cwd=seed)
    git("add", "-A", cwd=seed)
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "seed", cwd=seed)
    # Served as owner/name, like GitHub: the device reports the clone's remote as
    # 127.0.0.1/acme/widgets, which is how tickets for acme/widgets find it.
    bare = served / REPO.split("/")[0] / "widgets.git"
    bare.parent.mkdir()
    git("clone", "-q", "--bare", str(seed), str(bare), cwd=tmp_path)
    password = "canary-push-" + secrets.token_hex(12)
    workdir = tmp_path / "work" / "widgets"
    # endpointd's git helper answers only https requests: the origin has a test CA's
    # certificate, which the device's commands trust through GIT_SSL_CAINFO (passed on to
    # them by the device's policy, see pair_and_start).
    ca = TestCA(tmp_path / "test-ca")
    with (
        GitServer(served, password, ca=ca) as git_server,
        FakeGitHub() as github,
        endpointd_in(tmp_path) as daemon,
    ):
        workdir.parent.mkdir()
        git("clone", "-q", str(bare), str(workdir), cwd=tmp_path)
        git("remote", "set-url", "origin", git_server.url(REPO), cwd=workdir)
        github.add_repo(REPO)
        http_port, grpc_port = free_port(), free_port()
        state = tmp_path / "cp"
        replica_env = {
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
            **(env or {}),
        }
        replica_env.pop("SUPERAGENT_ADMIN_TOKEN", None)
        # The gateway's certificate, made now so endpointd can pin its fingerprint.
        gateway_tls(Settings(state_dir=state))
        replica = ReplicaProcess(replica_env, tmp_path / "replica.log", http_port)
        daemon.env["PYTHON_KEYRING_BACKEND"] = PLAINTEXT_KEYRING
        daemon.env["XDG_DATA_HOME"] = str(tmp_path / "keyring-data")
        daemon.env["GIT_SSL_CAINFO"] = str(ca.ca_file)
        data_dir = Path(daemon.env.get("ENDPOINTD_DATA_DIR") or tmp_path / "endpointd-data")
        daemon.env["ENDPOINTD_DATA_DIR"] = str(data_dir)
        world = World(
            github,
            git_server,
            fake_llm,
            daemon,
            replica,
            workdir,
            bare,
            password,
            grpc_port,
            data_dir,
        )
        world.script = script(world)
        fake_llm.respond_with(world.script)
        replica.start()
        try:
            yield world
        finally:
            replica.stop()
            log = replica.log.read_text(errors="replace")
            assert password not in log, "the push credential reached the replica's log"
            assert password not in daemon.log(), "the push credential reached endpointd's log"
            fake_llm.assert_never_saw(password)
            github.assert_never_saw(password)


async def pair_and_start(
    world: World, db: async_sessionmaker[AsyncSession], *, policy: str = ""
) -> None:
    """Store the push credential, pair the device as Alice's, allow the push for the
    origin's host only, add ``policy`` to the device's policy file, and start endpointd."""
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
    code = await pairing_code(db, DEVICE, owner=f"github:{ALICE}")
    tls = gateway_tls(Settings(state_dir=Path(world.replica.env["SUPERAGENT_STATE_DIR"])))
    assert tls is not None
    paired = await asyncio.to_thread(
        daemon.pair, f"https://127.0.0.1:{world.grpc_port}", code, "--fingerprint", tls.fingerprint
    )
    assert paired.returncode == 0, paired.stdout + paired.stderr
    # The push may use the credential, for the origin's host only; nothing else may. Commands
    # get a minimal environment: the test CA's bundle is passed on by name.
    path = daemon.config_dir / "policy.toml"
    text = passing_env(path.read_text(), "GIT_SSL_CAINFO")
    # ...and see it: commands see an allow-list of the machine (endpointd.guard.view),
    # where the owner adds what lies outside the system directories. (Setting the key
    # replaces the built-in toolchain list, which is kept.)
    readable = [*HOME_TOOLCHAINS, daemon.env["GIT_SSL_CAINFO"]]
    assert "\n# readable_paths = [" in text
    text = re.sub(
        r"(?m)^# readable_paths = \[.*\]$", f"readable_paths = {json.dumps(readable)}", text
    )
    path.write_text(
        text + f'\n[credentials.{CREDENTIAL}]\nallow = ["git push *"]\n'
        f"hosts = [{json.dumps(world.git.host)}]\n" + policy
    )
    rules = tomllib.loads(path.read_text())
    assert "GIT_SSL_CAINFO" in rules["env"]["pass"], rules.get("env")
    daemon.start()


def passing_env(policy: str, name: str) -> str:
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


def router_lines(request: ChatRequest) -> list[tuple[str | None, str]] | None:
    """A scripted router's reading of its turn: each line of the events message with the
    thread it is under (``thread thr_…`` headers), or None once the turn's tool calls were
    answered (the script then just ends the turn)."""
    last = request.last_message()
    if last is not None and last.get("role") == "tool":
        return None
    lines: list[tuple[str | None, str]] = []
    thread = None
    for line in (request.last_user_message() or "").splitlines():
        if found := re.match(r"thread (thr_\w+)", line):
            thread = found[1]
        lines.append((thread, line))
    return lines


def pending(result: str) -> bool:
    """Whether a tool result is a job still running, or queued for an away device: its
    result comes later as an event (what a scripted worker waits for)."""
    return "background job" in result or "stays queued" in result


async def connected(pool: asyncpg.Pool) -> bool:
    return bool(
        await pool.fetchval(
            "SELECT connected_replica IS NOT NULL FROM devices WHERE name = $1 "
            "AND revoked_at IS NULL",
            DEVICE,
        )
    )


async def start(
    world: World, pool: asyncpg.Pool, db: async_sessionmaker[AsyncSession], *, policy: str = ""
) -> None:
    """Allowlist Alice, wait for the replica, pair and start the device, wait for it."""
    # Allowlisted by her numeric user id: a login can be renamed and registered again.
    await save_policy(db, Admission(sources={"github": SourceAdmission(users=[str(ALICE)])}))
    await assert_eventually(world.replica.up, timeout=60, interval=0.2, message="replica up")
    await pair_and_start(world, db, policy=policy)
    await assert_eventually(lambda: connected(pool), timeout=30, message="endpointd connected")


async def webhook(world: World, event: str, payload: dict[str, Any], delivery: str) -> None:
    """A signed delivery of ``event`` to the replica's GitHub webhook, accepted."""
    body = json.dumps(payload).encode()
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{world.replica.url}/webhooks/github",
            content=body,
            headers={
                "X-GitHub-Event": event,
                "X-GitHub-Delivery": delivery,
                "X-Hub-Signature-256": sign(SECRET.encode(), body),
                "Content-Type": "application/json",
            },
        )
    assert response.status_code in (200, 202), response.text
