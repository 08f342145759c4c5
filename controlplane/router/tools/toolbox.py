"""The router's toolbox: its tools (:data:`TOOLS`, :data:`TOOL_SPECS`), each call run in a
transaction and recorded in ``router_decisions``, allowed or refused. :func:`record` is the
one writer of ``router_decisions`` (rules-only mode records its commands with it too)."""

from __future__ import annotations

import json
from typing import Any, Protocol

import asyncpg

from controlplane.db.pool import Db
from controlplane.ingest.intake import AdmissionSource
from controlplane.router.tools import judgement, threads, tickets
from controlplane.router.tools.core import Call, Done, Replies, ToolResult, Turn
from controlplane.tools.names import SUBAGENT
from controlplane.tools.registry import Refusal, Registry
from controlplane.tools.schema import function_spec
from superagent_shared.ids import new_id

__all__ = ["SUBAGENT_SPEC", "TOOLS", "TOOL_SPECS", "SubagentRunner", "Toolbox"]

TOOLS = Registry[Call, Done](tickets.tools, threads.tools, judgement.tools)
TOOL_SPECS: list[Any] = TOOLS.specs()
# Only in the single-session baseline (workers.design = single_session): the work runs
# inside the call, and the session waits for its report.
SUBAGENT_SPEC: Any = function_spec(
    SUBAGENT,
    "Do the work now: a subagent executes it on the device and returns its report; you "
    "wait until it is done. Arguments as for create_ticket.",
    tickets.CreateTicket,
)


class SubagentRunner(Protocol):
    async def run(self, ticket_id: str) -> dict[str, Any]: ...


class Toolbox:
    def __init__(
        self, pool: asyncpg.Pool, policy: AdmissionSource, subagent: SubagentRunner | None = None
    ) -> None:
        self.pool = pool
        self.policy = policy
        self.subagent = subagent
        self.replies = Replies()

    async def call(self, name: str, arguments: str | dict[str, Any], turn: Turn) -> ToolResult:
        """Run one tool call and record it; never raises for the model's mistakes."""
        if name == SUBAGENT and self.subagent is not None:
            return await self._run_subagent(self.subagent, arguments, turn)
        async with self.pool.acquire() as conn, conn.transaction():
            bound = TOOLS.bind(name, arguments)
            call = Call(self.pool, self.policy, conn, turn, self.replies)
            done = bound if isinstance(bound, Refusal) else await bound.run(call)
            ok = not isinstance(done, Refusal)
            if isinstance(done, Refusal):
                done = Done({"error": done.error}, f"refused: {done.error}", [])
            decision_id = await record(
                conn,
                name[:50],
                json.dumps(bound.arguments, default=str),  # as the model sent them
                # A refused call, or one that names no trigger, is on record under the
                # turn's batch: `triggers show` lists every call a turn over it made.
                done.triggers or list(turn.batch),
                done.outcome,
                ok,
                turn=turn,
            )
        return ToolResult(ok, done.content, decision_id, tuple(done.triggers) if ok else ())

    async def _run_subagent(
        self, subagent: SubagentRunner, arguments: str | dict[str, Any], turn: Turn
    ) -> ToolResult:
        """create_ticket, then the work itself, outside any transaction (it takes minutes)."""
        created = await self.call("create_ticket", arguments, turn)
        if not created.ok or "waits_for_approval" in created.content:
            return created  # nothing runs before the device's owner approves
        ticket_id = str(created.content["ticket"])
        report = await subagent.run(ticket_id)
        decision_id = await record(
            self.pool,
            SUBAGENT,
            json.dumps({"ticket": ticket_id}),
            [],
            f"{ticket_id}: {report.get('status') or report.get('outcome')}",
            True,
            turn=turn,
        )
        return ToolResult(True, report, decision_id, created.decided)


async def record(
    db: Db,
    tool: str,
    arguments: str,
    trigger_ids: list[str],
    outcome: str,
    ok: bool,
    *,
    turn: Turn | None = None,
) -> str:
    """One decision on record: the tool, its arguments (JSON text), the triggers it
    concerns, what came of it; ``turn``: the model's session and call, when a model made
    it. Its id."""
    decision_id = new_id("dec")
    await db.execute(
        "INSERT INTO router_decisions (id, session_id, llm_call_id, tool, arguments, "
        "trigger_ids, outcome, ok) VALUES ($1, $2, $3, $4, $5::text::jsonb, $6, $7, $8)",
        decision_id,
        None if turn is None else turn.session_id,
        None if turn is None else turn.llm_call_id,
        tool,
        arguments,
        trigger_ids,
        outcome,
        ok,
    )
    return decision_id
