"""Rules-only mode: the router's place when no model is configured.

Explicit requests can still do four things, as slash commands (after a mention or not):

* ``/run <device> <command>``: queue a command on a device; the result is posted back
  when it is final. Only on the requester's own device or one shared with them; on any
  other, nothing runs until its owner approves in chat (controlplane.gateway.authorization).
* ``/tickets``: the active tickets.
* ``/devices``: paired devices, online or not.
* ``/stop <ticket>``: stop a ticket. Its mandate is revoked, its subscriptions end, and its
  unfinished commands are cancelled.

Any other request gets a notice, once per thread, that no model is configured. Inferred
candidates need a model to be assessed; they are set aside, on record.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from typing import Any

import asyncpg

from controlplane.domain import (
    CLOSED_TICKET_SQL,
    CLOSED_TICKET_STATES,
    TERMINAL_COMMAND_STATES,
    CommandState,
    EffectKind,
)
from controlplane.effects.handlers import ClaimedEffect, Postpone
from controlplane.effects.outbox import enqueue
from controlplane.errors import NotFound, SuperagentError
from controlplane.gateway import authorization as access
from controlplane.gateway import specs
from controlplane.gateway.devices import ONLINE_WINDOW
from controlplane.gateway.queue import CommandQueue
from controlplane.ingest.intake import AdmissionSource
from controlplane.pause import hold_while_paused
from controlplane.replies import (
    IM_MAX_WORDS,
    Style,
    clip_words,
    enqueue_reply,
    run_result_id,
    style_of,
)
from controlplane.router import batch as batches
from controlplane.router.router import TurnFailed
from controlplane.router.tools import toolbox
from controlplane.router.tools.core import Turn
from controlplane.router.tools.toolbox import Toolbox
from controlplane.tickets import control, explain, subscriptions
from superagent_shared.ids import id_prefix, stable_id

NOTICE = (
    "No model is configured, so I can only follow commands: /run <device> <command>, "
    "/tickets, /devices, /stop <ticket>."
)
_COMMAND = re.compile(r"(?:^|\s)/(run|tickets|devices|stop|why)\b[ \t]*(.*)", re.S)
_TAIL = 1500  # characters of a command's output in its report


def parse(text: str) -> tuple[str, str] | None:
    """The slash command and its argument text, if the message holds one."""
    match = _COMMAND.search(text.strip())
    if match is None:
        return None
    return match.group(1), match.group(2).strip()


async def reply(
    tools: Toolbox, thread_id: str, text: str, turn: Turn, *, reply_id: str | None = None
) -> None:
    """A reply cut to the channel's limit: rules-only texts (a command's output, a list of
    tickets) are not written for it, and the reply tool refuses a chat reply over it.

    With ``reply_id``, the same reply is never sent twice, however often this is called.
    """
    if reply_id is None:
        source = await tools.pool.fetchval("SELECT source FROM threads WHERE id = $1", thread_id)
        if source is not None and style_of(source) is Style.im:
            text = clip_words(text, IM_MAX_WORDS)
        await tools.call("reply", {"thread": thread_id, "text": text}, turn)
        return
    async with tools.pool.acquire() as conn:
        if not await enqueue_reply(conn, thread_id, text, reply_id):
            exists = await conn.fetchval("SELECT 1 FROM threads WHERE id = $1", thread_id)
            if not exists:
                await tools.call("reply", {"thread": thread_id, "text": text}, turn)


class RulesOnlyRouter:
    def __init__(self, pool: asyncpg.Pool, queue: CommandQueue) -> None:
        self.pool = pool
        self.queue = queue
        self.tools = Toolbox(pool, AdmissionSource(pool))

    async def turn(self, leading: Callable[[], bool] = lambda: True) -> int:
        batch = await batches.take(self.pool)
        if not batch:
            return 0
        try:
            for event in batch.events:
                if not leading():
                    break
                await self._handle(event)
            await batches.mark_routed(self.pool, batch)
        except Exception as exc:
            # The batch's failure, never the loop's: counted, isolated, set aside (router.py).
            raise TurnFailed(batch.trigger_ids, exc, [e.id for e in batch.digest]) from exc
        return len(batch.events)

    async def _handle(self, event: batches.Event) -> None:
        turn = Turn(None, None, (event.id,))
        if event.verdict != "explicit":
            await self._record(event, "ignore", {}, "rules-only mode cannot assess candidates")
            return
        command = parse(event.text)
        if command is None:
            if not await self._noticed(event.thread_id):
                await reply(self.tools, event.thread_id, NOTICE, turn)
                await self._record(event, "notice", {}, "told that no model is configured")
            return
        name, argument = command
        try:
            text = await getattr(self, f"_{name}")(event, argument)
            ok = True
        except (SuperagentError, ValueError) as exc:
            text = f"/{name} failed: {getattr(exc, 'message', None) or exc}"
            ok = False
        await reply(self.tools, event.thread_id, text, turn)
        await self._record(event, name, {"argument": argument}, text, ok=ok)

    async def _noticed(self, thread_id: str) -> bool:
        found = await self.pool.fetchval(
            "SELECT 1 FROM router_decisions d JOIN triggers t ON t.id = ANY(d.trigger_ids) "
            "WHERE d.tool = 'notice' AND t.thread_id = $1 LIMIT 1",
            thread_id,
        )
        return found is not None

    async def _record(
        self, event: batches.Event, tool: str, args: dict[str, Any], outcome: str, ok: bool = True
    ) -> None:
        await toolbox.record(self.pool, tool, json.dumps(args), [event.id], outcome[:2000], ok)

    # -- the commands ----------------------------------------------------------------------

    async def _run(self, event: batches.Event, argument: str) -> str:
        try:
            words = shlex.split(argument)
        except ValueError as exc:
            raise ValueError(f"cannot parse the command ({exc})") from None
        if len(words) < 2:
            raise ValueError("usage: /run <device> <command>")
        device, argv = words[0], words[1:]
        specs.validate(specs.Exec(argv))
        async with self.pool.acquire() as conn, conn.transaction():
            try:
                found = await access.device(conn, device)
            except NotFound:
                raise ValueError(f"no paired device {device!r} (/devices lists them)") from None
            requester = await access.requester_of_trigger(conn, event.id)
            grant = access.check(found, requester, by="/run")
            run = {
                "trigger_id": event.id,
                "thread_id": event.thread_id,
                "device": found.id,
                "argv": argv,
                "actor": event.actor_name,
            }
            if not access.covers(grant):
                # Someone else's device: its owner is asked; the command is queued only once
                # they approve (controlplane.tickets.consent).
                approval = await access.ask(
                    conn, grant, requester, what=f"`{shlex.join(argv)[:200]}`", run=run
                )
                return (
                    f"{found.name} is {found.owner}'s: nothing runs until they approve "
                    f"({approval}); they are asked here. To use it without asking, its owner "
                    f"or an admin can run `superagent devices share {found.name} --with "
                    f"{requester.handle}`."
                )
            # Submitted by the outbox, keyed by this event: a turn that runs twice (a new
            # leader after a crash) queues the command once.
            await _enqueue(conn, EffectKind.RUN_COMMAND, event.id, run)
        return f"Running on {found.name}: {shlex.join(argv)} (the result follows here)"

    async def _tickets(self, event: batches.Event, argument: str) -> str:
        rows = await self.pool.fetch(
            f"SELECT id, title, state FROM tickets WHERE state NOT IN ({CLOSED_TICKET_SQL}) "
            "ORDER BY created_at LIMIT 50"
        )
        if not rows:
            return "No active tickets."
        return "Active tickets:\n" + "\n".join(
            f"- {r['id']} [{r['state']}] {r['title']}" for r in rows
        )

    async def _devices(self, event: batches.Event, argument: str) -> str:
        rows = await self.pool.fetch(
            "SELECT name, connected_replica IS NOT NULL "
            "AND last_seen_at > now() - $1::interval AS online "
            "FROM devices WHERE revoked_at IS NULL ORDER BY name",
            ONLINE_WINDOW,  # what `superagent devices list` calls online
        )
        if not rows:
            return "No devices are paired (superagent devices pair --name NAME)."
        return "Devices:\n" + "\n".join(
            f"- {r['name']}: {'online' if r['online'] else 'offline'}" for r in rows
        )

    async def _stop(self, event: batches.Event, argument: str) -> str:
        ticket_id = argument.split()[0] if argument else ""
        if id_prefix(ticket_id) != "tkt":
            raise ValueError("usage: /stop <ticket id>")
        stopped, commands = await stop_ticket(self.pool, ticket_id)
        for command_id in commands:
            await self.queue.cancel(command_id)
        if not stopped:
            return f"{ticket_id} was already finished or stopped."
        cancelled = f"; {len(commands)} command(s) cancelled" if commands else ""
        return f"Stopped {ticket_id}: mandate revoked, subscriptions ended{cancelled}."

    async def _why(self, event: batches.Event, argument: str) -> str:
        ticket_id = argument.split()[0] if argument else ""
        if id_prefix(ticket_id) != "tkt":
            raise ValueError("usage: /why <ticket id>")
        found = await explain.facts(self.pool, ticket_id)
        if found is None:
            raise ValueError(f"no ticket {ticket_id}")
        return explain.render(found)


async def stop_ticket(pool: asyncpg.Pool, ticket_id: str) -> tuple[bool, list[str]]:
    """Stop a ticket as everyone does (:func:`controlplane.tickets.control.stop`), and end
    its subscriptions. Returns (was it live, its unfinished commands, which the caller
    cancels through the queue)."""
    async with pool.acquire() as conn, conn.transaction():
        was = await control.stop(conn, ticket_id, by="/stop")
        commands = [
            r["id"]
            for r in await conn.fetch(
                "SELECT id FROM commands WHERE ticket_id = $1 AND kind <> 'cancel' "
                "AND state <> ALL($2::text[])",
                ticket_id,
                list(TERMINAL_COMMAND_STATES),
            )
        ]
        if was in CLOSED_TICKET_STATES:
            return False, commands
        await subscriptions.unsubscribe_all(conn, ticket_id)
        return True, commands


async def _not_allowed(pool: asyncpg.Pool, payload: dict[str, Any]) -> str | None:
    """Why a /run may not be queued now (None: it may). Checked again at submit, the last
    moment: a share taken back or a device that changed hands since the request counts."""
    async with pool.acquire() as conn:
        try:
            found = await access.device(conn, str(payload["device"]))
        except NotFound:
            return None  # the submit says so
        approval = payload.get("approval")
        if approval is not None and await conn.fetchval(
            "SELECT 1 FROM device_approvals WHERE id = $1 AND state = 'approved' "
            "AND device_id = $2 AND trigger_id = $3",
            approval,
            found.id,
            payload["trigger_id"],
        ):
            return None
        requester = await access.requester_of_trigger(conn, str(payload["trigger_id"]))
        if access.covers(access.check(found, requester, by="/run")):
            return None
        return f"{found.name} is {found.owner}'s, and {requester.name} may not use it"


async def _enqueue(conn: Any, kind: str, key: str, payload: dict[str, Any]) -> None:
    await enqueue(conn, kind, key, payload)


def run_handler(pool: asyncpg.Pool, queue: CommandQueue) -> Any:
    """The outbox handler of /run: submit the command once, then post its result when final."""

    async def run(effect: ClaimedEffect) -> None:
        await hold_while_paused(pool)
        origin = f"/run {effect.payload['trigger_id']} by {effect.payload['actor']}"
        command_id = await pool.fetchval("SELECT id FROM commands WHERE origin = $1", origin)
        tools = Toolbox(pool, AdmissionSource(pool))
        thread = str(effect.payload["thread_id"])
        # The outcome, whichever it is, is the result promised ("the result follows here").
        said = run_result_id(str(effect.payload["trigger_id"]))
        if command_id is None:
            refused = await _not_allowed(pool, effect.payload)
            if refused is not None:  # unshared or unapproved since: checked again, said once
                await reply(
                    tools, thread, f"/run refused: {refused}", Turn(None, None, ()), reply_id=said
                )
                return
            try:
                command_id = await queue.submit(
                    str(effect.payload["device"]),
                    specs.Exec([str(word) for word in effect.payload["argv"]]),
                    origin=origin,
                )
            except SuperagentError as exc:  # revoked or unpaired since: say so, once
                text = f"/run failed: {exc.message}"
                await reply(tools, thread, text, Turn(None, None, ()), reply_id=said)
                return
        result = await queue.result(command_id)
        if result.state == CommandState.AWAITING_APPROVAL:
            deadline = f", refused at {result.approval_deadline:%H:%M:%S} UTC if nobody answers"
            await reply(
                tools,
                thread,
                f"{command_id} waits for local approval on the device (rule: "
                f"{result.approval_rule}{deadline if result.approval_deadline else ''}). "
                "On the device: endpointd approvals.",
                Turn(None, None, ()),
                reply_id=stable_id("msg", f"approval:{command_id}"),  # said once
            )
        if not result.done:
            raise Postpone(5.0, f"{command_id} is {result.state}")
        tail = result.output_tail.decode("utf-8", "replace")[-_TAIL:]
        how = (
            f"exit {result.exit_code}"
            if result.state == CommandState.FINISHED
            else f"{result.state}" + (f": {result.error}" if result.error else "")
        )
        text = f"{command_id} {how}." + (f"\n```\n{tail}\n```" if tail.strip() else "")
        await reply(tools, thread, text, Turn(None, None, ()), reply_id=said)

    return run
