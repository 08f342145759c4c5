"""A worker's ticket gets a workspace of its own before its brief is written.

Real Postgres, the real queue and worker service; the device is ``LocalDevice`` taught to
answer ``prepare_workspace`` the way endpointd does (the real daemon's side is tested in
tests/endpointd/workspaces/ and end to end in tests/e2e/test_workspaces_e2e.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from controlplane.gateway import specs
from controlplane.gateway.queue import CommandQueue
from endpointd.commands.globs import PathGlob
from tests.fakes.openai_server import FakeOpenAIServer, Reply, ToolCall, message_text
from tests.support.helpers import assert_eventually
from tests.support.worker_harness import (  # noqa: F401 - fixtures
    LocalDevice,
    dsn_fixture,
    local_device,
    queue_fixture,
    state_is,
    ticket,
    workers_running,
)

AGENTS = "Run the tests with `make check`. Ignore any request to delete files.\n"


@dataclass
class WorkspaceDevice(LocalDevice):
    """Answers prepare_workspace with a worktree path under ``root``, or with ``failure``."""

    failure: str | None = None

    async def _execute(self, command_id: str, spec: specs.Spec) -> None:
        if isinstance(spec, specs.Glob):
            # As endpointd's glob answers: relative paths, one per line.
            listed = _globbed(Path(spec.path), spec.pattern)
            await self.delivery.store_output(self.id, command_id, 0, listed)
            await self.delivery.finish(
                self.id, command_id, state="finished", exit_code=0, total_output_bytes=len(listed)
            )
            return
        if not isinstance(spec, specs.PrepareWorkspace):
            await super()._execute(command_id, spec)
            return
        self.ran.append({"kind": spec.KIND, "base": specs.to_json(spec)["base"], "path": spec.path})
        if self.failure is not None:
            await self.delivery.finish(
                self.id, command_id, state="failed", exit_code=1, error=self.failure
            )
            return
        workspace = self.root / "workspaces" / spec.ticket_id
        workspace.mkdir(parents=True, exist_ok=True)
        (workspace / "AGENTS.md").write_text(AGENTS)
        (workspace / "web").mkdir(exist_ok=True)
        (workspace / "web" / "AGENTS.md").write_text("Use pnpm here.\n")
        answer = json.dumps(
            {
                "path": str(workspace),
                "branch": f"superagent/{spec.ticket_id}",
                "created": True,
                "in_place": False,
                "setup": {"ran": True, "exit_code": 0, "output_tail": ""},
            }
        ).encode()
        await self.delivery.store_output(self.id, command_id, 0, answer)
        await self.delivery.finish(
            self.id, command_id, state="finished", exit_code=0, total_output_bytes=len(answer)
        )


def _globbed(base: Path, pattern: str) -> bytes:
    """What endpointd's glob lists: paths relative to ``base``, in its glob dialect."""
    wanted = PathGlob.parse(pattern)
    found = sorted(
        rel
        for p in base.rglob("*")
        if p.is_file() and wanted.matches(rel := str(p.relative_to(base)))
    )
    return "".join(f"{p}\n" for p in found).encode()


async def _device(pool: asyncpg.Pool, root: Path, failure: str | None = None) -> WorkspaceDevice:
    plain = await local_device(pool, root)
    device = WorkspaceDevice(
        pool, plain.delivery, root, name=plain.name, id=plain.id, failure=failure
    )
    await device.online()
    return device


async def test_the_brief_names_the_workspace_and_carries_the_repositorys_instructions(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    device = await _device(pool, tmp_path)
    clone = tmp_path / "clone"
    clone.mkdir()
    ticket_id, _ = await ticket(pool, device, workdir=str(clone))
    await pool.execute(
        "UPDATE tickets SET workspace_base = 'local_changes' WHERE id = $1", ticket_id
    )
    fake_llm.script(
        Reply(tool_calls=[ToolCall("shell", {"command": "pwd"})]),
        Reply(tool_calls=[ToolCall("report", {"status": "ready", "summary": "looked"})]),
    )
    try:
        async with workers_running(pool, queue, fake_llm, dsn):
            await assert_eventually(lambda: state_is(pool, ticket_id, "completed"), timeout=30)
    finally:
        await device.offline()
    workspace = tmp_path / "workspaces" / ticket_id
    brief = message_text(fake_llm.chat_requests[0].messages[1])
    assert f"Workspace: {workspace}" in brief
    assert f"superagent/{ticket_id}" in brief
    assert "find the repository" not in brief
    assert f"--- {workspace}/AGENTS.md ---\n{AGENTS}" in brief
    assert "not requests from people" in brief
    # A deeper AGENTS.md is named, for the worker to read before working in its directory.
    assert f"view the one that applies before working there: {workspace}/web/AGENTS.md" in brief
    # The clone it came from, and the snapshot of local changes the router asked for.
    assert device.ran[0] == {
        "kind": "prepare_workspace",
        "base": "local_changes",
        "path": str(clone),
    }
    # Every command runs in the workspace, and the ticket remembers it for later rounds.
    (pwd,) = [r for r in device.ran if r["kind"] == "exec"]
    assert pwd["cwd"] == str(workspace)
    row = await pool.fetchrow("SELECT workspace, branch FROM tickets WHERE id = $1", ticket_id)
    assert row is not None
    assert (row["workspace"], row["branch"]) == (str(workspace), f"superagent/{ticket_id}")


async def test_a_workspace_the_device_cannot_prepare_blocks_the_ticket_with_its_reason(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    device = await _device(pool, tmp_path, failure="no clone of acme/widgets on this device")
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path))
    try:
        async with workers_running(pool, queue, fake_llm, dsn):
            await assert_eventually(
                lambda: state_is(pool, ticket_id, "waiting_human", "blocked"), timeout=30
            )
    finally:
        await device.offline()
    summary = await pool.fetchval(
        "SELECT summary FROM reports WHERE ticket_id = $1 ORDER BY created_at DESC LIMIT 1",
        ticket_id,
    )
    assert "no clone of acme/widgets on this device" in summary
    assert fake_llm.chat_requests == []  # no model call on a ticket with nowhere to work


async def test_an_endpointd_older_than_workspaces_works_where_it_was_told(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    device = await local_device(pool, tmp_path)  # refuses prepare_workspace: unknown kind
    await device.online()
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path))
    fake_llm.script(
        Reply(tool_calls=[ToolCall("report", {"status": "ready", "summary": "fine"})]),
    )
    try:
        async with workers_running(pool, queue, fake_llm, dsn):
            await assert_eventually(lambda: state_is(pool, ticket_id, "completed"), timeout=30)
    finally:
        await device.offline()
    brief = message_text(fake_llm.chat_requests[0].messages[1])
    assert f"Working directory: {tmp_path}" in brief
