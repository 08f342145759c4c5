"""What every worker tool shares: the ticket (:class:`Ticket`), what a step's calls changed
(:class:`Outcome`), and the :class:`Workbench` they run on, which submits commands to the
ticket's device and records them as the ticket's jobs."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Annotated, Any

import asyncpg
from pydantic import Field

from controlplane.domain import CommandState
from controlplane.gateway import specs
from controlplane.gateway.queue import CommandQueue, CommandResult
from controlplane.settings import WorkerSettings
from controlplane.tickets import authority, events, output
from controlplane.tools.registry import Refused, Registry
from controlplane.workers.devices import device_online

__all__ = ["Call", "Limit", "Offset", "Outcome", "Ticket", "Workbench", "WorkerTools"]

# A slice of output or text: where it starts, and how much of it (None: the tool's default).
Offset = Annotated[int | None, Field(ge=0, le=1 << 40)]
Limit = Annotated[int | None, Field(ge=1, le=64_000)]


@dataclass(frozen=True)
class Ticket:
    """What a worker's tools need to know about its ticket."""

    id: str
    title: str
    device_id: str | None
    device_name: str | None
    repo: str | None
    workdir: str | None
    branch: str | None
    speculative: bool
    # The ticket's own workspace on the device, once prepared (workers.workspace); while
    # set, ``workdir`` is the same path. ``workspace_base`` is "in_place" for a plain
    # directory used as it is.
    workspace: str | None = None
    workspace_base: str | None = None
    setup: str | None = None  # the setup step's outcome, for the brief
    upstream: str | None = None  # the pull request's branch the workspace tracks, if any

    @property
    def in_place(self) -> bool:
        return self.workspace_base == "in_place"


@dataclass
class Outcome:
    """What a step's tool calls changed for the loop."""

    report: dict[str, Any] | None = None  # a final report to apply (the round ends)
    device_away: bool = False  # a command is queued for a device that is not connected
    # Calls not run for lack of authority (authority.external), and the input behind it:
    # the round ends and the ticket waits for people to confirm.
    held: list[str] = field(default_factory=list)
    held_by: authority.Untrusted | None = None


class Workbench:
    """A worker's ticket, its device, and what the current step changed."""

    def __init__(
        self, pool: asyncpg.Pool, queue: CommandQueue, settings: WorkerSettings, ticket: Ticket
    ) -> None:
        self.pool = pool
        self.queue = queue
        self.settings = settings
        self.ticket = ticket
        self.outcome = Outcome()

    def path(self, path: str) -> str:
        """``path`` on the device: a relative one is in the ticket's working directory."""
        if posixpath.isabs(path) or not self.ticket.workdir:
            return path
        return posixpath.join(self.ticket.workdir, path)

    def device(self) -> str:
        if self.ticket.device_id is None:
            raise Refused("this ticket has no device; report a question asking which one")
        return self.ticket.device_id

    async def online(self) -> bool:
        return await device_online(self.pool, self.device())

    async def run(
        self, spec: specs.Spec, wait: float, *, call_id: str, script: str
    ) -> CommandResult:
        """Submit ``spec`` as a job of the ticket's, and wait up to ``wait`` for it."""
        command_id = await self.queue.submit(
            self.device(), spec, ticket_id=self.ticket.id, origin=f"worker {self.ticket.id}"
        )
        await events.start_job(self.pool, self.ticket.id, command_id, call_id, script)
        result = await self.queue.wait(command_id, 0.05 if not await self.online() else wait)
        if not result.done:
            # Its completion becomes an event for this worker (events.take).
            await events.run_in_background(self.pool, command_id)
            if result.state == CommandState.QUEUED and not await self.online():
                self.outcome.device_away = True
        return result

    def pending(self, result: CommandResult) -> dict[str, Any]:
        """What the model reads of a job still running (or queued for an away device)."""
        described = output.describe(result)
        if self.outcome.device_away:
            described["note"] = (
                f"the device {self.ticket.device_name or ''} is offline: this stays queued and "
                "runs when it reconnects; its result arrives as an event"
            )
        elif "note" not in described:
            described["note"] = (
                "still running as a background job; its completion arrives as an event "
                "(job_output to look, stop to end it)"
            )
        return described


@dataclass(frozen=True)
class Call:
    """What a worker tool runs with: the workbench, and the model's id for this call."""

    bench: Workbench
    id: str


WorkerTools = Registry[Call, dict[str, Any]]
