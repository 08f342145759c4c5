"""Pieces for worker tests: a device that runs commands for real, tickets, a worker pass.

``LocalDevice`` stands in for the gateway and endpointd together: it marks its row
connected, takes its commands from the real queue (``CommandDelivery.pending``), runs exec
commands as real subprocesses (``sh -c`` in a temporary directory), does file operations
on the real filesystem, and records results through the gateway's own side of the queue
(``CommandDelivery``). The
end-to-end test (``test_workers_e2e``) uses the real endpointd instead.

Below it: tickets filed as the router files them, the service running, and the readers
several worker test files share (what the model was shown, the service's passes, the
ticket's state and replies).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import openai
import pytest

from controlplane.db.urls import asyncpg_dsn
from controlplane.gateway import authorization as access
from controlplane.gateway import specs
from controlplane.gateway.delivery import CommandDelivery
from controlplane.gateway.queue import CommandQueue
from controlplane.ingest.admission import Actor
from controlplane.ingest.intake import IncomingTrigger, Ingested, Intake, ThreadRef
from controlplane.settings import LlmSettings, Settings, WorkerSettings
from controlplane.tickets import device_grant
from superagent_shared.ids import new_id
from tests.fakes.openai_server import (
    FAKE_API_KEY,
    ChatRequest,
    FakeOpenAIServer,
    Reply,
    ToolCall,
    message_text,
)
from tests.support.helpers import assert_eventually


@dataclass
class LocalDevice:
    pool: asyncpg.Pool
    delivery: CommandDelivery
    root: Path
    name: str = field(default_factory=lambda: f"dev-{new_id('dev')[-6:]}")
    id: str = field(default_factory=lambda: new_id("dev"))
    poll: float = 0.05  # seconds between looks at the queue
    ran: list[dict[str, Any]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None
    _busy: set[str] = field(default_factory=set)
    _running: dict[str, list[asyncio.Task[None]]] = field(default_factory=dict)

    async def pair(self, owner: str = "web:alice") -> None:
        """Paired for ``owner``: by default the web chat account that asks for every
        :func:`ticket` (work goes only to a device its requester may use)."""
        await self.pool.execute(
            "INSERT INTO devices (id, name, owner, public_key, version) "
            "VALUES ($1, $2, $3, $4, '1')",
            self.id,
            self.name,
            owner,
            os.urandom(32),
        )

    async def online(self) -> None:
        await self.pool.execute(
            "UPDATE devices SET connected_replica = 'test', connected_at = now(), "
            "last_seen_at = now() WHERE id = $1",
            self.id,
        )
        if self._task is None:
            self._task = asyncio.create_task(self._serve())

    async def offline(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.pool.execute(
            "UPDATE devices SET connected_replica = NULL WHERE id = $1", self.id
        )

    def shell_runs(self, command: str) -> int:
        """How many times this device ran ``command`` as a shell command (``sh -c``)."""
        return sum(
            1 for ran in self.ran if ran["kind"] == "exec" and ran["argv"] == ["sh", "-c", command]
        )

    async def _serve(self) -> None:
        while True:
            await self.pool.execute(
                "UPDATE devices SET last_seen_at = now() WHERE id = $1", self.id
            )
            for command in await self.delivery.pending(self.id):
                if command.id in self._busy:
                    continue
                self._busy.add(command.id)
                await self.delivery.mark_accepted(self.id, command.id)
                task = asyncio.create_task(self._run(command.id, command.spec))
                self._running[command.id] = [task]
            await asyncio.sleep(self.poll)

    async def _run(self, command_id: str, spec: specs.Spec) -> None:
        # A command still running when its test ends must not outlive the test's pool.
        with contextlib.suppress(asyncpg.InterfaceError):
            await self._execute(command_id, spec)

    async def _execute(self, command_id: str, spec: specs.Spec) -> None:
        if isinstance(spec, specs.PrepareWorkspace | specs.ReleaseWorkspace):
            # What an endpointd older than workspaces answers: the ticket works where it
            # was told (tests of workspaces use the real endpointd).
            await self.delivery.finish(
                self.id,
                command_id,
                state="refused",
                refusal_reason="unknown_kind",
                error="this endpointd does not know the command's kind",
            )
            return
        self.ran.append({"kind": spec.KIND, **specs.to_json(spec)})
        out, exit_code, error = b"", 0, None
        if isinstance(spec, specs.Exec):
            proc = await asyncio.create_subprocess_exec(
                *spec.argv,
                cwd=spec.cwd or str(self.root),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            out, _ = await proc.communicate(spec.stdin)
            exit_code = proc.returncode or 0
        elif isinstance(spec, specs.ReadFile):
            try:
                out = await asyncio.to_thread(Path(spec.path).read_bytes)
            except OSError as exc:
                exit_code, error = 1, str(exc)
        elif isinstance(spec, specs.WriteFile):
            await asyncio.to_thread(_write, Path(spec.path), spec.content)
        elif isinstance(spec, specs.ListDir):
            out = "\n".join(sorted(os.listdir(spec.path))).encode()
        elif isinstance(spec, specs.Cancel):
            for task in self._running.pop(spec.target_command_id, ()):
                task.cancel()
            with contextlib.suppress(Exception):
                await self.delivery.finish(
                    self.id, spec.target_command_id, state="cancelled", total_output_bytes=0
                )
        if out:
            await self.delivery.store_output(self.id, command_id, 0, out)
        await self.delivery.finish(
            self.id,
            command_id,
            state="finished" if error is None else "failed",
            exit_code=exit_code,
            error=error,
            total_output_bytes=len(out),
        )


def _write(path: Path, content: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)


@pytest.fixture(name="queue")
async def queue_fixture(pool: asyncpg.Pool) -> AsyncIterator[CommandQueue]:
    """The command queue over the test's pool (import the fixture to use it)."""
    queue = CommandQueue(pool)
    yield queue
    await queue.close()


@pytest.fixture(name="device")
async def device_fixture(pool: asyncpg.Pool, tmp_path: Path) -> AsyncIterator[LocalDevice]:
    """A paired ``LocalDevice``, online for the test."""
    device = await local_device(pool, tmp_path)
    await device.online()
    yield device
    await device.offline()


@pytest.fixture(name="dsn")
def dsn_fixture(database_url: str) -> str:
    return asyncpg_dsn(database_url)


async def local_device(pool: asyncpg.Pool, root: Path) -> LocalDevice:
    device = LocalDevice(pool, CommandDelivery(pool), root)
    await device.pair()
    return device


async def ticket(
    pool: asyncpg.Pool,
    device: LocalDevice | None,
    *,
    title: str = "fix the thing",
    workdir: str | None = None,
    speculative: bool = False,
    thread: str | None = None,
) -> tuple[str, str]:
    """alice asks for ``title`` in the web chat, and the router files the ticket
    (:func:`file_ticket`); returns (ticket id, thread id)."""
    ingested = await Intake(pool).ingest(
        IncomingTrigger(
            source="web",
            external_id=new_id("msg"),
            thread=ThreadRef(thread or new_id("thr")),
            actor=Actor("alice", "alice", groups=("console",)),
            kind="message",
            text=f"@superagent {title}",
            direct=True,
        )
    )
    ticket_id = await file_ticket(
        pool, ingested, device, title=title, workdir=workdir, speculative=speculative
    )
    return ticket_id, ingested.thread_id


async def file_ticket(
    pool: asyncpg.Pool,
    request: Ingested,
    device: LocalDevice | None,
    *,
    title: str,
    initiator_id: str = "alice",
    workdir: str | None = None,
    speculative: bool = False,
    repo: str | None = None,
) -> str:
    """The ticket the router files for alice's ``request`` (``initiator_id`` is her id on
    its channel), recorded as the router records it: the ticket, her mandate, the request's
    thread subscribed, the device check for her, and the request done with (the router's
    turn is not under test). Returns the ticket id."""
    ticket_id = new_id("tkt")
    # One transaction, as the router's own (controlplane/tickets/opening.py): a worker
    # running beside the test may claim the ticket the moment it is committed, and must
    # find its mandate and device check with it.
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "INSERT INTO tickets (id, title, device_id, workdir, speculative, repo) "
            "VALUES ($1, $2, $3, $4, $5, $6)",
            ticket_id,
            title,
            device.id if device else None,
            workdir,
            speculative,
            repo,
        )
        await conn.execute(
            "INSERT INTO mandates (id, ticket_id, kind, initiator_id, initiator_name, "
            "trigger_id, scope) VALUES ($1, $2, 'explicit', $3, 'alice', $4, $5)",
            new_id("mnd"),
            ticket_id,
            initiator_id,
            request.trigger_id,
            title,
        )
        await conn.execute(
            "INSERT INTO subscriptions (thread_id, ticket_id) VALUES ($1, $2)",
            request.thread_id,
            ticket_id,
        )
        if device is not None:  # the device check, recorded as the router records it
            await device_grant.grant_ticket(
                conn,
                ticket_id,
                await access.device(conn, device.id),
                await access.requester_of_ticket(conn, ticket_id),
                by="the test",
                what=f"{ticket_id} ({title})",
            )
        await conn.execute(
            "UPDATE triggers SET routed_at = now() WHERE id = $1", request.trigger_id
        )
    return ticket_id


def settings_for(
    llm: FakeOpenAIServer, *, boundary: LlmSettings | None = None, **workers: Any
) -> Settings:
    """Settings over the fake model: the workers' quick defaults overridden by ``workers``,
    and the model boundary's settings (``boundary``, if given)."""
    defaults: dict[str, Any] = {
        "lease_seconds": 4,
        "renew_seconds": 1,
        "foreground_seconds": 2,
        "retry_base_seconds": 0.5,
    }
    chosen: dict[str, Any] = {} if boundary is None else {"llm": boundary}
    return Settings(
        openai_base_url=llm.url,
        openai_api_key=FAKE_API_KEY,
        workers=WorkerSettings(**(defaults | workers)),
        **chosen,
    )


def client_for(llm: FakeOpenAIServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=llm.url, api_key=FAKE_API_KEY, max_retries=0)


@contextlib.asynccontextmanager
async def workers_running(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    llm: FakeOpenAIServer,
    dsn: str,
    *,
    owner: str = "replica-a",
    boundary: LlmSettings | None = None,
    **limits: Any,
) -> AsyncIterator[Any]:
    from controlplane.workers.service import WorkerService

    settings = settings_for(llm, boundary=boundary, **limits)
    service = WorkerService(pool, queue, client_for(llm), settings, owner=owner, dsn=dsn)
    await service.start()
    try:
        yield service
    finally:
        await service.stop(10)


async def ticket_state(pool: asyncpg.Pool, ticket_id: str) -> tuple[str, str | None]:
    row = await pool.fetchrow("SELECT state, hold FROM tickets WHERE id = $1", ticket_id)
    assert row is not None
    return row["state"], row["hold"]


async def state_is(pool: asyncpg.Pool, ticket_id: str, state: str, hold: Any = ...) -> bool:
    """Whether the ticket is in ``state`` (and, if given, has ``hold``): for waiting on."""
    now = await ticket_state(pool, ticket_id)
    return now[0] == state and (hold is ... or now[1] == hold)


async def replies_on(pool: asyncpg.Pool, thread_id: str) -> list[str]:
    """The texts of the replies the program queued on a thread (outbox effects), oldest first."""
    rows = await pool.fetch(
        "SELECT payload->>'text' AS text FROM effects "
        "WHERE kind = 'reply' AND payload->>'thread_id' = $1 ORDER BY created_at",
        thread_id,
    )
    return [row["text"] for row in rows]


class Passes:
    """Counts the service's completed passes: after two more, a pass has started and
    finished since now, so whatever it would have started, it has. Tests that show
    something does *not* happen wait for these instead of sleeping."""

    def __init__(self, service: Any) -> None:
        self.count = 0
        claim = service._claim

        async def counted() -> None:
            await claim()
            self.count += 1

        service._claim = counted

    async def wait(self, more: int = 2) -> None:
        target = self.count + more
        await assert_eventually(
            lambda: self.count >= target, timeout=10, message=f"{more} passes of the service"
        )


# -- what the model was shown, and its answers ---------------------------------------------


def turn_of(request: ChatRequest) -> int:
    """How many answers the model already gave in this session (0 on its first call)."""
    return sum(1 for m in request.messages if m.get("role") == "assistant")


def inbox_records(request: ChatRequest) -> list[dict[str, Any]]:
    """Every inbox record the worker was shown in ``request``: each events message is a
    header line, then one JSON object per line (every line after the header parses)."""
    found: list[dict[str, Any]] = []
    for message in request.messages:
        text = message_text(message)
        if message.get("role") != "user" or not text.startswith("Events since"):
            continue
        for line in text.splitlines()[1:]:
            record = json.loads(line)
            assert isinstance(record, dict), line
            found.append(record)
    return found


def tool_results(request: ChatRequest) -> list[dict[str, Any]]:
    """The tool results (parsed) the worker sent in one model request, oldest first."""
    out = []
    for message in request.tool_results():
        parsed = json.loads(message["content"])
        assert isinstance(parsed, dict)
        out.append(parsed)
    return out


def report_reply(status: str, summary: str, **extra: Any) -> Reply:
    """The model's answer that ends a turn: a call of the ``report`` tool."""
    return Reply(tool_calls=[ToolCall("report", {"status": status, "summary": summary, **extra})])
