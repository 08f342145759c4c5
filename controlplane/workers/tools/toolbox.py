"""The worker's toolbox: its tools (:data:`TOOLS`, :data:`TOOL_SPECS`), and each call
checked, held for lack of authority, or run. Every tool answers with JSON the model reads;
a mistake is an ``error`` it can act on, never an exception."""

from __future__ import annotations

from typing import Any

from controlplane.errors import SuperagentError
from controlplane.tickets import authority
from controlplane.tools.registry import Refusal, Refused, Registry
from controlplane.workers.tools import device, github, ticket
from controlplane.workers.tools.core import Call, Workbench

__all__ = ["TOOLS", "TOOL_SPECS", "WorkerToolbox"]

TOOLS = Registry[Call, dict[str, Any]](device.tools, github.tools, ticket.tools)
TOOL_SPECS: list[Any] = TOOLS.specs()


class WorkerToolbox(Workbench):
    async def call(self, name: str, arguments: str | None, call_id: str) -> dict[str, Any]:
        bound = TOOLS.bind(name, arguments)
        try:
            if isinstance(bound, Refusal):
                return {"error": bound.error}
            held = await self._hold(name, bound.arguments)
            if held is not None:
                return held
            done = await bound.run(Call(self, call_id))
        except Refused as refused:
            return {"error": str(refused)}
        except SuperagentError as exc:
            return {"error": str(exc)}
        return {"error": done.error} if isinstance(done, Refusal) else done

    async def held(self, name: str, args: dict[str, Any]) -> dict[str, Any] | None:
        """Whether a call made outside the toolbox (a harness round's push) is held
        for lack of authority, exactly as the same tool call would be: its answer, or None
        to go ahead."""
        try:
            return await self._hold(name, args)
        except Refused as refused:
            return {"error": str(refused)}

    async def _hold(self, name: str, args: dict[str, Any]) -> dict[str, Any] | None:
        """The answer to a call held for lack of authority, or None to run it."""
        what = authority.external(name, args)
        if what is None:
            return None
        reason = await authority.untrusted(self.pool, self.ticket.id, self.settings.hold_untrusted)
        if reason is None:
            return None
        if self.ticket.speculative:
            # A speculative ticket says nothing to anyone, so it cannot ask: refused.
            raise Refused(
                f"not run: you want to {what} right after reading {reason.trigger_id} "
                f"({reason.authority}), and this speculative ticket cannot ask anyone to "
                "confirm; work on the device until you can report a confirmed fix"
            )
        self.outcome.held.append(what)
        self.outcome.held_by = reason
        asked = await authority.requester(self.pool, self.ticket.id)
        return {
            "held": True,
            "note": authority.held_note(what, reason, asked.name or "the requester"),
        }
