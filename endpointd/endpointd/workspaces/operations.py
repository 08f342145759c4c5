"""PrepareWorkspace and ReleaseWorkspace as the daemon runs them, and its periodic upkeep.

The daemon's starter hands the two operations here (:mod:`endpointd.commands.starter`)
and keeps starting other commands meanwhile: a prepare may fetch for a while and run a
setup step for minutes. The git work runs in a worker thread
(:class:`endpointd.workspaces.manager.Workspaces`); the setup step, when there is one, runs
through ``run_setup``, the daemon's way to run a command in the workspace's sandbox.

The fetch first uses the owner's own git setup. If it fails, and the owner stored a
credential whose policy ``hosts`` name the remote's host, it is tried once more with that
credential (``stored_credential``): through endpointd's git helper, for that host only,
with every other credential helper switched off, so the value never reaches the owner's
git credential storage, argv, a file or a log.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from typing import TYPE_CHECKING

from endpointd.workspaces.bases import FetchAuth
from endpointd.workspaces.errors import FetchFailed
from endpointd.workspaces.manager import Prepared, SetupPlan, Workspaces
from endpointd.workspaces.store import Setup
from superagent_shared.messages import PrepareWorkspace, ReleaseWorkspace

if TYPE_CHECKING:
    from endpointd.guard.policy import Policy

__all__ = ["UPKEEP_SECONDS", "prepare", "release", "upkeep_forever"]

log = logging.getLogger(__name__)

# How often released workspaces past their retention, and the disk budget, are looked at.
UPKEEP_SECONDS = 600.0
# The first look, soon after the daemon starts (it may have been down past a retention).
FIRST_UPKEEP_SECONDS = 30.0


async def prepare(
    workspaces: Workspaces,
    op: PrepareWorkspace,
    policy: Policy,
    *,
    approved: bool,
    run_setup: Callable[[SetupPlan], Awaitable[Setup]],
    stored_credential: Callable[[str], AbstractAsyncContextManager[FetchAuth | None]],
) -> bytes:
    """The ticket's workspace, prepared (and set up once); the answer's JSON."""
    try:
        prepared: Prepared = await asyncio.to_thread(
            workspaces.prepare, op, policy, approved=approved
        )
    except FetchFailed as failed:
        async with stored_credential(failed.url) as auth:
            if auth is None:
                raise
            log.info("fetching for %s again, with a credential stored for its host", op.ticket_id)
            prepared = await asyncio.to_thread(
                workspaces.prepare, op, policy, approved=approved, auth=auth
            )
    plan = prepared.setup
    if plan is not None:
        if plan.not_run:
            outcome = Setup(ran=False, output_tail=plan.not_run)
        else:
            log.info("setting up the workspace of %s (%s)", op.ticket_id, plan.source)
            outcome = await run_setup(plan)
        await asyncio.to_thread(workspaces.record_setup, op.ticket_id, outcome)
        prepared = replace(prepared, record=replace(prepared.record, setup=outcome))
    verb = "prepared" if prepared.created else "found again"
    log.info("workspace of %s %s: %s", op.ticket_id, verb, prepared.record.answer_path)
    return json.dumps(prepared.answer()).encode()


async def release(workspaces: Workspaces, op: ReleaseWorkspace, policy: Policy) -> None:
    removed = await asyncio.to_thread(workspaces.release, op.ticket_id, policy)
    for removal in removed:
        if removal.error:
            log.warning("workspace of %s not removed yet: %s", removal.ticket, removal.error)


async def upkeep_forever(workspaces: Workspaces, policy: Policy) -> None:
    """Measure and prune the workspaces every :data:`UPKEEP_SECONDS`; a failure is logged
    and tried again next time, never the daemon's end."""
    delay = FIRST_UPKEEP_SECONDS
    while True:
        await asyncio.sleep(delay)
        delay = UPKEEP_SECONDS
        try:
            await asyncio.to_thread(workspaces.upkeep, policy)
        except Exception:
            log.exception("the workspaces' upkeep failed; trying again in %.0f s", delay)
