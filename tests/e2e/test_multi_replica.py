"""Three replicas and the watchdog on one Postgres, five real endpointd processes, a stream of
requests and chat, and a random replica killed with SIGKILL every few seconds.

Devices reach the replicas through a load balancer (``tests/fakes/balancer.py``), as in a
deployment; webhooks go to a random live replica and are redelivered elsewhere when it
dies mid-request, as GitHub does. The fake OpenAI server plays the router (a ticket per
task request, a reply per chat message and per finished task) and the workers (one
command, then ready). At the end:

* every event was decided once: it left the router's inbox, each task request has one
  ticket, and every ticket completed;
* every command ran once: each command's own nonce is in its device's log exactly once;
* every reply was posted once: one comment per chat message and per task, and as many
  recorded sends (``sent_messages``) as comments;
* the router's leadership moved from replica to replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.channels.github.events import sign
from controlplane.gateway.tls import gateway_tls
from controlplane.ingest.admission import Admission, SourceAdmission
from controlplane.settings import Settings
from controlplane.workers.session import INTERRUPTED
from controlplane.workers.worker import RECOVERY_NOTE
from tests.fakes.balancer import Balancer
from tests.fakes.endpointd_process import Endpointd
from tests.fakes.github_server import FakeGitHub
from tests.fakes.openai_server import FAKE_API_KEY, ChatRequest, FakeOpenAIServer, Reply, ToolCall
from tests.support.gateway_harness import pairing_code
from tests.support.helpers import assert_eventually, free_port, save_policy
from tests.support.replica_process import ReplicaProcess

REPO = "acme/chaos"
SECRET = "chaos-webhook-secret"
DEVICES = 5
TASKS = 12
CHATS = 18
KILL_EVERY = 3.0
KILLS = 4  # at least, during the stream and while its last work is in flight
REPLICAS = 3


@dataclass
class Models:
    """The router and the workers, answering from what each request shows."""

    workdirs: dict[str, str]  # device name -> its working directory
    nonces: dict[str, str] = field(default_factory=dict)  # nonce -> ticket

    def __call__(self, request: ChatRequest) -> Reply:
        if (request.system_prompt() or "").startswith("You are the router"):
            return self.route(request)
        return self.work(request)

    def route(self, request: ChatRequest) -> Reply:
        last = request.last_message() or {}
        if last.get("role") == "tool":
            return Reply(content="Done.")
        calls: list[ToolCall] = []
        thread = None
        for line in (request.last_user_message() or "").splitlines():
            if found := re.match(r"thread (thr_\w+)", line):
                thread = found[1]
                continue
            found = re.search(r"\[(trg_\w+)\] (\w+) ([\w.]+) from", line)
            if found is None:
                continue
            if found[3].startswith("report."):
                ticket = re.search(r"(tkt_\w+)", line)
                calls.append(
                    ToolCall("reply", {"thread": thread, "text": f"Done: {ticket and ticket[1]}"})
                )
            elif task := re.search(r"run task (\d+)", line):
                device = f"chaos{int(task[1]) % DEVICES}"
                calls.append(
                    ToolCall(
                        "create_ticket",
                        {
                            "title": f"task {task[1]}",
                            "scope": "run it",
                            "threads": [thread],
                            "device": device,
                            "mandate_from": found[1],
                            "workdir": self.workdirs[device],
                        },
                    )
                )
            elif chat := re.search(r"hello (\d+)", line):
                calls.append(ToolCall("reply", {"thread": thread, "text": f"hi {chat[1]}"}))
            else:
                calls.append(ToolCall("ignore", {"trigger": found[1], "reason": "chatter"}))
        return Reply(tool_calls=calls) if calls else Reply(content="Nothing to do.")

    def work(self, request: ChatRequest) -> Reply:
        ran = [
            m
            for m in request.messages
            if m.get("role") == "tool" and '"exit_code": 0' in str(m.get("content"))
        ]
        ended = any(
            m.get("role") == "user" and '"type": "job_ended"' in str(m.get("content"))
            for m in request.messages
        )
        if ran or ended:
            return Reply(tool_calls=[ToolCall("report", {"status": "ready", "summary": "ran"})])
        last = request.messages[-1]
        waiting = last.get("role") == "tool" and '"note"' in str(last.get("content"))
        if waiting and INTERRUPTED not in str(last.get("content")):
            return Reply(content="Waiting for the command.")
        if last.get("role") == "user" and last.get("content") == RECOVERY_NOTE:
            pass  # an interrupted call may not have run: run a new command (a new nonce)
        nonce = uuid.uuid4().hex
        ticket = re.search(r"Ticket (tkt_\w+)", request.messages[1]["content"])
        self.nonces[nonce] = ticket[1] if ticket else "?"
        return Reply(tool_calls=[ToolCall("shell", {"command": f"echo {nonce} >> ran.log"})])


async def _post(replicas: list[ReplicaProcess], delivery: str, body: bytes) -> None:
    """Deliver to a random live replica; redeliver to another when one fails (GitHub's
    retry), until one has it."""
    deadline = time.monotonic() + 60
    async with httpx.AsyncClient(timeout=10) as client:
        while time.monotonic() < deadline:
            live = [r for r in replicas if r.alive()]
            if live:
                target = random.choice(live)
                with contextlib.suppress(httpx.HTTPError):
                    response = await client.post(
                        f"{target.url}/webhooks/github",
                        content=body,
                        headers={
                            "X-GitHub-Event": "issue_comment",
                            "X-GitHub-Delivery": delivery,
                            "X-Hub-Signature-256": sign(SECRET.encode(), body),
                            "Content-Type": "application/json",
                        },
                    )
                    if response.status_code in (200, 202):
                        return
            await asyncio.sleep(0.3)
    raise AssertionError(f"no replica took delivery {delivery}")


def _comment(github: FakeGitHub, number: int, text: str) -> bytes:
    """The delivery for a comment alice really wrote on the fake (so its 👀 can land)."""
    comment = github.comment(REPO, number, text)
    return json.dumps(
        {
            "action": "created",
            "issue": {"number": number, "title": f"issue {number}"},
            "comment": comment,
            "repository": {"full_name": REPO},
            "sender": comment["user"],
        }
    ).encode()


@pytest.fixture
async def devices(tmp_path: Path) -> AsyncIterator[list[Endpointd]]:
    made = [Endpointd(tmp_path, name=f"chaos{i}") for i in range(DEVICES)]
    yield made
    for daemon in made:
        daemon.cleanup()


async def test_killing_replicas_loses_and_duplicates_nothing(
    tmp_path: Path,
    database_url: str,
    pool: asyncpg.Pool,
    db: async_sessionmaker[AsyncSession],
    fake_llm: FakeOpenAIServer,
    devices: list[Endpointd],
) -> None:
    workdirs = {}
    for daemon in devices:
        work = daemon.root / "work"
        work.mkdir(parents=True)
        workdirs[daemon.root.name] = str(work)
    models = Models(workdirs)
    fake_llm.respond_with(models)
    with FakeGitHub() as github:
        # Allowlisted by her numeric user id: a login can be renamed and registered again.
        alice = str(github.user("alice")["id"])
        await save_policy(db, Admission(sources={"github": SourceAdmission(users=[alice])}))
        github.add_repo(REPO)
        for number in range(1, TASKS + CHATS + 1):
            github.open_issue(REPO, f"issue {number}")
        tls_home = tmp_path / "tls-home"
        tls = gateway_tls(Settings(state_dir=tls_home))
        assert tls is not None
        grpc_ports = [free_port() for _ in range(REPLICAS)]
        replicas = []
        for index in range(REPLICAS):
            state = tmp_path / f"replica{index}"
            shutil.copytree(tls_home / "tls", state / "tls")
            http = free_port()
            env = {
                **os.environ,
                "DATABASE_URL": database_url,
                "SUPERAGENT_STATE_DIR": str(state),
                "SUPERAGENT_HTTP__PORT": str(http),
                "SUPERAGENT_GRPC__PORT": str(grpc_ports[index]),
                "OPENAI_BASE_URL": fake_llm.url,
                "OPENAI_API_KEY": FAKE_API_KEY,
                "SUPERAGENT_GITHUB__TOKEN": github.pat,
                "SUPERAGENT_GITHUB__API_URL": github.url,
                "SUPERAGENT_GITHUB__WEBHOOK_SECRET": SECRET,
                "SUPERAGENT_GITHUB__AGENT_LOGIN": "octo-agent",
                "SUPERAGENT_ROUTER__LEASE_SECONDS": "3",
                "SUPERAGENT_ROUTER__RENEW_SECONDS": "1",
                "SUPERAGENT_WORKERS__LEASE_SECONDS": "4",
                "SUPERAGENT_WORKERS__RENEW_SECONDS": "1",
                "SUPERAGENT_WORKERS__MAX_WORKERS": "20",
                "SUPERAGENT_EFFECTS__LEASE_SECONDS": "3",
            }
            env.pop("SUPERAGENT_ADMIN_TOKEN", None)
            replicas.append(ReplicaProcess(env, tmp_path / f"replica{index}.log", http))
        balancer = await Balancer(grpc_ports).start()
        watchdog_env = {**replicas[0].env, "SUPERAGENT_WATCHDOG__INTERVAL_SECONDS": "2"}
        watchdog = ReplicaProcess(watchdog_env, tmp_path / "watchdog.log", command="watchdog")
        watchdog.start()
        leaders: list[str] = []
        try:
            for replica in replicas:
                replica.start()
            for replica in replicas:
                await assert_eventually(replica.up, timeout=90, interval=0.3, message="replica up")
            for daemon in devices:
                # Alice's devices: work goes only to a device its requester may use.
                code = await pairing_code(db, daemon.root.name, owner=f"github:{alice}")
                paired = await asyncio.to_thread(
                    daemon.pair,
                    f"https://127.0.0.1:{balancer.port}",
                    code,
                    "--fingerprint",
                    tls.fingerprint,
                )
                assert paired.returncode == 0, paired.stdout + paired.stderr
                daemon.start()
            await assert_eventually(
                lambda: _connected(pool, [d.root.name for d in devices]),
                timeout=60,
                message="every device connected",
            )

            async def watch_leader() -> None:
                while True:
                    holder = await pool.fetchval(
                        "SELECT holder FROM leases WHERE name = 'router' AND expires_at > now()"
                    )
                    if holder and (not leaders or leaders[-1] != holder):
                        leaders.append(holder)
                    await asyncio.sleep(0.2)

            async def chaos() -> None:
                kill = 0
                while True:
                    await asyncio.sleep(KILL_EVERY)
                    # Only a replica that is serving, and never the last one: a replica
                    # still starting (slow on a loaded machine) killed again and again
                    # would add up to all of them down, which no redelivery outlasts.
                    victims = [r for r in replicas if r.alive() and await r.up()]
                    if len(victims) < 2:
                        continue
                    victim = random.choice(victims)
                    if kill % 2 == 0:  # every other kill takes the leader: it has to move
                        leader = leaders[-1] if leaders else ""
                        victim = next((r for r in victims if _is(leader, r)), victim)
                    await asyncio.to_thread(victim.kill9)
                    kill += 1
                    await asyncio.sleep(1.0)
                    victim.start()

            async def stream() -> None:
                events = [(n, f"@superagent run task {n}") for n in range(1, TASKS + 1)]
                events += [(TASKS + n, f"@superagent hello {n}") for n in range(1, CHATS + 1)]
                random.shuffle(events)
                for index, (number, text) in enumerate(events):
                    await _post(replicas, f"d-{index}", _comment(github, number, text))
                    await asyncio.sleep(0.5)

            watcher = asyncio.create_task(watch_leader())
            chaos_task = asyncio.create_task(chaos())
            await stream()
            await asyncio.sleep(6)  # more kills while the last work is in flight
            await assert_eventually(  # however slowly replicas come back on this machine
                lambda: sum(r.kills for r in replicas) >= KILLS, timeout=120, message="kills"
            )
            chaos_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await chaos_task
            for replica in replicas:
                if not replica.alive():
                    replica.start()

            def comments() -> dict[int, list[str]]:
                return {
                    n: [
                        str(c["body"])
                        for c in github.comments(REPO, n)
                        if c["user"]["login"] != "alice"
                    ]
                    for n in range(1, TASKS + CHATS + 1)
                }

            def all_answered() -> bool:
                seen = comments()
                missing = [n for n, texts in seen.items() if not texts]
                assert not missing, f"no answer yet on issues {missing}"
                return True

            try:
                await assert_eventually(all_answered, timeout=150, interval=1.0)
            except AssertionError as exc:
                missing = [n for n, texts in comments().items() if not texts]
                raise AssertionError(f"{exc}\n{await _diagnose(pool, missing)}") from None
            await asyncio.sleep(4)  # a duplicate would have had time to go out
            watcher.cancel()
        finally:
            for replica in replicas:
                replica.stop()
            watchdog.stop()
            await balancer.stop()

        # -- what happened, from the record --------------------------------------------------
        assert sum(r.kills for r in replicas) >= KILLS, [r.kills for r in replicas]
        assert len(set(leaders)) >= 2, f"the router leader never moved: {leaders}"
        final = comments()
        for number in range(1, TASKS + 1):
            texts = final[number]
            assert len(texts) == 1, f"task issue {number}: {texts}"
            assert texts[0].startswith("Done: tkt_"), texts
        for n in range(1, CHATS + 1):
            texts = final[TASKS + n]
            assert len(texts) == 1, f"chat issue {TASKS + n}: {texts}"
            assert texts[0].startswith(f"hi {n}"), texts
        sent = await pool.fetchval(
            "SELECT count(*) FROM sent_messages s JOIN threads t ON t.id = s.thread_id "
            "WHERE t.source = 'github' AND t.external_id LIKE $1",
            f"{REPO}#%",
        )
        assert sent == TASKS + CHATS
        # Every event was decided, and each task request has exactly one ticket, done.
        assert not await pool.fetchval(
            "SELECT count(*) FROM triggers t JOIN threads th ON th.id = t.thread_id "
            "WHERE th.external_id LIKE $1 AND t.routed_at IS NULL",
            f"{REPO}#%",
        )
        tickets = await pool.fetch(
            "SELECT m.trigger_id, count(*) AS n, min(t.state) AS state, min(t.id) AS id "
            "FROM mandates m JOIN tickets t ON t.id = m.ticket_id "
            "JOIN triggers g ON g.id = m.trigger_id JOIN threads th ON th.id = g.thread_id "
            "WHERE th.external_id LIKE $1 GROUP BY m.trigger_id",
            f"{REPO}#%",
        )
        assert len(tickets) == TASKS
        assert all(row["n"] == 1 for row in tickets)
        assert {row["state"] for row in tickets} == {"completed"}
        # Every command ran once: its nonce is in its device's log exactly once.
        logged: dict[str, int] = {}
        for daemon in devices:
            log = daemon.root / "work" / "ran.log"
            for line in log.read_text().split() if log.exists() else []:
                logged[line] = logged.get(line, 0) + 1
        commands = await pool.fetch(
            "SELECT c.id, c.spec, c.state FROM commands c WHERE c.kind = 'exec' "
            "AND c.ticket_id = ANY($1::text[])",
            [row["id"] for row in tickets],
        )
        assert commands
        for command in commands:
            spec = (
                command["spec"]
                if isinstance(command["spec"], dict)
                else json.loads(command["spec"])
            )
            nonce = spec["argv"][-1].split()[1]
            if command["state"] == "finished":
                assert logged.get(nonce) == 1, (command["id"], nonce, logged.get(nonce))
        assert all(count == 1 for count in logged.values()), logged


def _is(holder: str, replica: ReplicaProcess) -> bool:
    """Whether the lease holder id names this replica's process (host:pid:random)."""
    return replica.process is not None and f":{replica.process.pid}:" in holder


async def _connected(pool: asyncpg.Pool, names: list[str]) -> bool:
    count = await pool.fetchval(
        "SELECT count(*) FROM devices WHERE name = ANY($1::text[]) AND revoked_at IS NULL "
        "AND connected_replica IS NOT NULL",
        names,
    )
    return bool(count == len(names))


async def _diagnose(pool: asyncpg.Pool, numbers: list[int]) -> str:
    """Where the chain broke for each unanswered issue: its events, tickets, reports,
    replies in the outbox and sends, as the database holds them."""
    lines = []
    for number in numbers:
        thread = await pool.fetchval(
            "SELECT id FROM threads WHERE external_id = $1", f"{REPO}#{number}"
        )
        lines.append(f"issue {number}: thread {thread}")
        queries = {
            "trigger": "SELECT id, kind, verdict, route, routed_at, undecidable_at, route_error, "
            "route_attempts FROM triggers WHERE thread_id = $1 ORDER BY created_at",
            "ticket": "SELECT t.id, t.state, t.created_at FROM tickets t WHERE t.id IN "
            "(SELECT ticket_id FROM subscriptions WHERE thread_id = $1)",
            "report": "SELECT r.id, r.ticket_id, r.status, r.created_at FROM reports r WHERE "
            "r.ticket_id IN (SELECT ticket_id FROM subscriptions WHERE thread_id = $1)",
            "effect": "SELECT id, kind, key, attempts, dead_at, last_error FROM effects "
            "WHERE payload->>'thread_id' = $1",
            "sent": "SELECT reply_id, sent_at FROM sent_messages WHERE thread_id = $1",
        }
        for what, query in queries.items():
            try:
                rows = await pool.fetch(query, thread)
            except asyncpg.PostgresError as exc:
                lines.append(f"  {what}: ({exc})")
                continue
            lines.extend(f"  {what}: {dict(row)}" for row in rows)
    return "\n".join(lines)
