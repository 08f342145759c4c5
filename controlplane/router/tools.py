"""The router's tools: what the model may do, with authority enforced here, not in the prompt.

The model proposes, this module disposes. A tool call the rules do not allow is refused
with a reason the model can read and act on. Examples: a ticket whose mandate would rest
on an event that is not an explicit request, or an unknown thread. Every call, allowed or
refused, is recorded in ``router_decisions`` with the triggers it concerned and the model
call that made it.

Tools (OpenAI function-calling schemas in :data:`TOOL_SPECS`):

* ``create_ticket(title, scope, threads, device, mandate_from, repo?, workdir?,
  speculative?)``: work, resting on one trigger's authority. That trigger must be an
  explicit request, or a candidate that this source's ``auto`` mode accepted through
  ``assess``. A worker picks the ticket up (:mod:`controlplane.workers`). The device must
  be the requester's own or shared with them; any other waits, with nothing run, for its
  owner's approval in chat (:mod:`controlplane.authorization`).
* ``reply(thread, text)``: a message to people, sent through the outbox.
* ``subscribe(thread, ticket)`` / ``link(thread, ticket)``: "handled by" (its events go
  to the ticket) versus "related to" (context only).
* ``recall(id)``: an object with summaries and its neighbours' IDs (Chain of Recall).
* ``ignore(trigger, reason)``.
* ``forward(trigger, ticket)``: give an event to a ticket's worker (used when pass-through
  is off); ``stop_ticket(ticket, reason)``; ``explain(ticket)``: the recorded facts behind
  "why is tkt_x stuck?" (:mod:`controlplane.tickets.explain`).
* ``subagent(...)``: only in the single-session baseline: create_ticket, then the work
  itself inside the call (:mod:`controlplane.workers.subagent`).
* ``assess(trigger, verdicts, intent, target)``: the structured judgement of an inferred
  candidate against its source's rules.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import asyncpg

from controlplane.authorization import devices as access
from controlplane.db.pool import Conn
from controlplane.domain import CLOSED_TICKET_STATES, EffectKind, Notify
from controlplane.effects.outbox import enqueue
from controlplane.ingest import policy as policies
from controlplane.ingest.intake import PolicySource
from controlplane.llm.schema import arguments_problem, specs_by_name
from controlplane.replies import IM_MAX_WORDS, Style, style_of, word_count
from controlplane.tickets import control, explain
from controlplane.tickets.reports import Spent
from superagent_shared.ids import id_prefix, new_id, stable_id

MAX_REPLY_CHARS = 20_000
SNIPPET_CHARS = 200


def tool_spec(name: str, description: str, properties: dict[str, Any], required: list[str]) -> Any:
    """An OpenAI function-calling tool schema (strict: no properties beyond these)."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


_ID = {"type": "string"}
TOOL_SPECS: list[Any] = [
    tool_spec(
        "create_ticket",
        "Create a ticket for work. mandate_from is the trigger whose request it fulfils: an "
        "explicit request, or a candidate accepted by assess. Its threads are subscribed.",
        {
            "title": {"type": "string"},
            "scope": {"type": "string", "description": "What is and is not to be done."},
            "threads": {"type": "array", "items": _ID},
            "device": {
                "type": ["string", "null"],
                "description": "Device name or id, or 'my laptop' for one the requester owns.",
            },
            "mandate_from": _ID,
            "repo": {
                "type": ["string", "null"],
                "description": "owner/name, when not the GitHub thread's own repository.",
            },
            "workdir": {
                "type": ["string", "null"],
                "description": "The repository's directory on the device, when known.",
            },
            "speculative": {
                "type": "boolean",
                "description": "Quietly try to reproduce and fix: nothing is said or "
                "delivered unless the worker confirms both.",
            },
        },
        ["title", "scope", "threads", "device", "mandate_from"],
    ),
    tool_spec(
        "explain",
        "Why a ticket is where it is (for 'why is tkt_x stuck?'): its state and reason, "
        "device, current round and last activity, unfinished commands, last report, and "
        "the watchdog's findings and actions, all from the record.",
        {"ticket": _ID},
        ["ticket"],
    ),
    tool_spec(
        "forward",
        "Give an event to a ticket's worker (an event on a thread the ticket handles that "
        "reached you rather than the worker).",
        {"trigger": _ID, "ticket": _ID},
        ["trigger", "ticket"],
    ),
    tool_spec(
        "stop_ticket",
        "Stop a ticket for good (its mandate is revoked and its device work cancelled).",
        {"ticket": _ID, "reason": {"type": "string"}},
        ["ticket", "reason"],
    ),
    tool_spec(
        "reply",
        "Send a message on a thread (chat: short; GitHub: structured and complete).",
        {"thread": _ID, "text": {"type": "string"}},
        ["thread", "text"],
    ),
    tool_spec(
        "subscribe",
        "Make a ticket handle a thread: the thread's events go to the ticket's worker.",
        {"thread": _ID, "ticket": _ID},
        ["thread", "ticket"],
    ),
    tool_spec(
        "link",
        "Note that a thread is related to a ticket (context only; no events delivered).",
        {"thread": _ID, "ticket": _ID},
        ["thread", "ticket"],
    ),
    tool_spec(
        "recall",
        "Fetch an object (trigger, thread, ticket) by ID, with its neighbours' IDs.",
        {"id": _ID},
        ["id"],
    ),
    tool_spec(
        "ignore",
        "Decide that a trigger needs nothing.",
        {"trigger": _ID, "reason": {"type": "string"}},
        ["trigger", "reason"],
    ),
    tool_spec(
        "assess",
        "Judge an inferred candidate against every enabled rule of its source.",
        {
            "trigger": _ID,
            "verdicts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "rule": {"type": "string"},
                        "matches": {"type": "boolean"},
                        "why": {"type": "string"},
                    },
                    "required": ["rule", "matches", "why"],
                    "additionalProperties": False,
                },
            },
            "intent": {"type": "string", "description": "What would be done."},
            "target": {"type": "string", "description": "Where (repository, service...)."},
        },
        ["trigger", "verdicts", "intent", "target"],
    ),
]
TOOL_NAMES = frozenset(spec["function"]["name"] for spec in TOOL_SPECS)
TOOL_SCHEMAS = specs_by_name(TOOL_SPECS)
SUBAGENT = "subagent"
# Only in the single-session baseline (workers.design = single_session): the work runs
# inside the call, and the session waits for its report.
SUBAGENT_SPEC: Any = {
    "type": "function",
    "function": {
        **TOOL_SPECS[0]["function"],
        "name": SUBAGENT,
        "description": "Do the work now: a subagent executes it on the device and returns "
        "its report; you wait until it is done. Arguments as for create_ticket.",
    },
}


class SubagentRunner(Protocol):
    async def run(self, ticket_id: str) -> dict[str, Any]: ...


async def devices_of(conn: asyncpg.Connection, trigger: asyncpg.Record) -> list[tuple[str, str]]:
    """(id, lowercased name + labels) of the active devices the trigger's initiator owns:
    owned by their person (``superagent users link``) or by their account (``SOURCE:ID``),
    never matched by a display name or a handle."""
    return await access.owned(conn, await access.requester_of_trigger(conn, trigger["id"]))


class Refused(Exception):
    """A tool call the rules do not allow; the message goes back to the model."""


@dataclass(frozen=True)
class Turn:
    """Where a tool call comes from: the router session, its model call, and the batch."""

    session_id: str | None
    llm_call_id: str | None
    batch: Sequence[str]  # the trigger ids of this turn's batch


@dataclass(frozen=True)
class ToolResult:
    ok: bool
    content: dict[str, Any]  # what the model sees, as JSON
    decision_id: str

    def as_message(self) -> str:
        return json.dumps(self.content, ensure_ascii=False, default=str)


def _str(args: dict[str, Any], name: str, *, limit: int = 10_000, empty: bool = False) -> str:
    value = args.get(name)
    if not isinstance(value, str):
        raise Refused(f"{name} must be a string")
    if not empty and not value.strip():
        raise Refused(f"{name} must not be empty")
    if len(value) > limit:
        raise Refused(f"{name} is longer than {limit} characters")
    return value


def _optional(args: dict[str, Any], name: str, *, limit: int) -> str | None:
    value = args.get(name)
    if value is None or value == "":
        return None
    return _str(args, name, limit=limit)


def _id(args: dict[str, Any], name: str, prefix: str) -> str:
    value = _str(args, name, limit=100)
    if id_prefix(value) != prefix:
        raise Refused(f"{name} must be a {prefix}_ id, not {value!r}")
    return value


class Toolbox:
    def __init__(
        self, pool: asyncpg.Pool, policy: PolicySource, subagent: SubagentRunner | None = None
    ) -> None:
        self.pool = pool
        self.policy = policy
        self.subagent = subagent
        self._replies: dict[tuple[str, str], int] = {}  # replies per (batch, thread)
        self._replies_batch = ""

    async def call(self, name: str, arguments: str | dict[str, Any], turn: Turn) -> ToolResult:
        """Run one tool call and record it; never raises for the model's mistakes."""
        if name == SUBAGENT and self.subagent is not None:
            return await self._run_subagent(self.subagent, arguments, turn)
        args: dict[str, Any] = {}
        triggers: list[str] = []
        async with self.pool.acquire() as conn, conn.transaction():
            try:
                if isinstance(arguments, str):
                    try:
                        parsed = json.loads(arguments or "{}")
                    except json.JSONDecodeError as exc:
                        raise Refused(f"arguments are not valid JSON: {exc.msg}") from None
                else:
                    parsed = arguments
                if not isinstance(parsed, dict):
                    raise Refused("arguments must be a JSON object")
                args = parsed
                if name not in TOOL_NAMES:
                    raise Refused(
                        f"no tool {name!r}; the tools are {', '.join(sorted(TOOL_NAMES))}"
                    )
                problem = arguments_problem(name, args, TOOL_SCHEMAS)
                if problem is not None:
                    raise Refused(problem)  # the schema it was shown: it can correct itself
                handler = getattr(self, f"_{name}")
                content, outcome, triggers = await handler(conn, args, turn)
                ok = True
            except Refused as refused:
                content = {"error": str(refused)}
                outcome = f"refused: {refused}"
                ok = False
            decision_id = new_id("dec")
            await conn.execute(
                "INSERT INTO router_decisions (id, session_id, llm_call_id, tool, arguments, "
                "trigger_ids, outcome, ok) VALUES ($1, $2, $3, $4, $5::text::jsonb, $6, $7, $8)",
                decision_id,
                turn.session_id,
                turn.llm_call_id,
                name[:50],
                json.dumps(args, default=str),
                triggers,
                outcome,
                ok,
            )
        return ToolResult(ok, content, decision_id)

    async def _run_subagent(
        self, subagent: SubagentRunner, arguments: str | dict[str, Any], turn: Turn
    ) -> ToolResult:
        """create_ticket, then the work itself, outside any transaction (it takes minutes)."""
        created = await self.call("create_ticket", arguments, turn)
        if not created.ok or "waits_for_approval" in created.content:
            return created  # nothing runs before the device's owner approves
        ticket_id = str(created.content["ticket"])
        report = await subagent.run(ticket_id)
        decision_id = new_id("dec")
        await self.pool.execute(
            "INSERT INTO router_decisions (id, session_id, llm_call_id, tool, arguments, "
            "trigger_ids, outcome, ok) VALUES ($1, $2, $3, $4, $5::text::jsonb, '{}', $6, true)",
            decision_id,
            turn.session_id,
            turn.llm_call_id,
            SUBAGENT,
            json.dumps({"ticket": ticket_id}),
            f"{ticket_id}: {report.get('status') or report.get('outcome')}",
        )
        return ToolResult(True, report, decision_id)

    # -- the tools ---------------------------------------------------------------------

    async def _trigger(self, conn: asyncpg.Connection, trigger_id: str) -> asyncpg.Record:
        row = await conn.fetchrow(
            "SELECT id, source, thread_id, actor_id, actor_name, verdict, policy_version_id, "
            "person_id FROM triggers WHERE id = $1",
            trigger_id,
        )
        if row is None:
            raise Refused(f"no trigger {trigger_id}")
        return row

    async def _device(
        self, conn: asyncpg.Connection, device: object, trigger: asyncpg.Record
    ) -> str | None:
        """A device by name or id; "my laptop" (any "my …") is one the initiator owns."""
        if device is None:
            return None
        if not isinstance(device, str) or not device.strip():
            raise Refused("device must be a device name or id, or null")
        found = await conn.fetchval(
            "SELECT id FROM devices WHERE (id = $1 OR name = $1) AND revoked_at IS NULL",
            device,
        )
        if found is not None:
            return str(found)
        words = device.strip().casefold().split()
        if words[0] not in ("my", "mine"):
            raise Refused(f"no paired device {device!r}")
        requester = await access.requester_of_trigger(conn, trigger["id"])
        owned = await access.owned(conn, requester)
        who = requester.name
        if not owned:
            raise Refused(
                f"{who} owns no paired device (pair one with `superagent devices pair --name "
                f"NAME --owner {requester.handle}`, or link their accounts to the person who "
                "owns one with `superagent users link`)"
            )
        kind = words[1:]  # "my laptop" → prefer a device called or labelled laptop
        fitting = [d for d in owned if not kind or any(k in d[1] for k in kind)]
        if len(fitting) == 1:
            return fitting[0][0]
        if len(owned) == 1:
            return owned[0][0]
        names = ", ".join(name for _, name in owned)
        raise Refused(f"{who} owns several devices ({names}); name one of them")

    async def _thread_ids(self, conn: asyncpg.Connection, ids: object) -> list[str]:
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise Refused("threads must be a list of thr_ ids")
        wanted = list(dict.fromkeys(ids))
        found = {
            row["id"]
            for row in await conn.fetch("SELECT id FROM threads WHERE id = ANY($1)", wanted)
        }
        missing = [i for i in wanted if i not in found]
        if missing:
            raise Refused(f"no such thread: {', '.join(missing)}")
        return wanted

    async def _live_ticket(self, conn: asyncpg.Connection, ticket_id: str) -> None:
        state = await conn.fetchval("SELECT state FROM tickets WHERE id = $1", ticket_id)
        if state is None:
            raise Refused(f"no ticket {ticket_id}")
        if state in CLOSED_TICKET_STATES:
            raise Refused(f"ticket {ticket_id} is {state}")

    async def _create_ticket(
        self, conn: asyncpg.Connection, args: dict[str, Any], turn: Turn
    ) -> tuple[dict[str, Any], str, list[str]]:
        title = _str(args, "title", limit=300)
        scope = _str(args, "scope")
        source_id = _id(args, "mandate_from", "trg")
        trigger = await self._trigger(conn, source_id)
        if trigger["verdict"] == "explicit":
            kind = "explicit"
        elif trigger["verdict"] == "candidate":
            accepted = await conn.fetchval(
                "SELECT outcome FROM router_decisions WHERE tool = 'assess' AND ok "
                "AND $1 = ANY(trigger_ids) ORDER BY created_at DESC LIMIT 1",
                source_id,
            )
            if accepted != "accepted":
                raise Refused(
                    f"{source_id} is an inferred candidate; a ticket needs an assess of it "
                    "that this source's auto mode accepts"
                    + (f" (the last assess: {accepted})" if accepted else "")
                )
            kind = "inferred"
        else:
            raise Refused(
                f"{source_id} is not a request anyone may act on ({trigger['verdict']}); "
                "only explicit requests, or candidates accepted by assess, can start work"
            )
        threads = await self._thread_ids(conn, args.get("threads", []))
        if trigger["thread_id"] not in threads:
            threads.insert(0, trigger["thread_id"])  # the requester's thread hears back
        device_id = await self._device(conn, args.get("device"), trigger)
        repo = _optional(args, "repo", limit=300)
        if repo is not None and repo.count("/") != 1:
            raise Refused(f"repo must be owner/name, not {repo!r}")
        workdir = _optional(args, "workdir", limit=4096)
        speculative = args.get("speculative") is True or (
            kind == "inferred"
            and (await self.policy.current())[1].for_source(trigger["source"]).speculative
        )
        # The same request and title make the same ticket: a turn that runs again (a new
        # leader after the last one died mid-turn) finds the ticket it already created.
        ticket_id = stable_id("tkt", f"ticket:{source_id}:{title}")
        if await conn.fetchval("SELECT 1 FROM tickets WHERE id = $1", ticket_id):
            return (
                {"ticket": ticket_id, "already_created": True},
                f"{ticket_id} already exists (a repeated turn)",
                [source_id],
            )
        await conn.execute(
            "INSERT INTO tickets (id, title, device_id, repo, workdir, speculative) "
            "VALUES ($1, $2, $3, $4, $5, $6)",
            ticket_id,
            title,
            device_id,
            repo,
            workdir,
            speculative,
        )
        await conn.execute("SELECT pg_notify($1, $2)", Notify.WORKERS, ticket_id)
        await conn.execute(
            "INSERT INTO mandates (id, ticket_id, kind, initiator_id, initiator_name, "
            "trigger_id, policy_version_id, scope, person_id) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            new_id("mnd"),
            ticket_id,
            kind,
            trigger["actor_id"],
            trigger["actor_name"],
            source_id,
            trigger["policy_version_id"],
            scope,
            trigger["person_id"],
        )
        await conn.execute(
            "INSERT INTO subscriptions (thread_id, ticket_id) SELECT unnest($1::text[]), $2",
            threads,
            ticket_id,
        )
        content: dict[str, Any] = {"ticket": ticket_id, "subscribed": threads, "mandate": kind}
        if speculative:
            content["speculative"] = True
        outcome = f"created {ticket_id} ({kind}, for {trigger['actor_name']})"
        if device_id is not None:
            # Checked here in code, whatever the model chose: the requester's own device, one
            # shared with them, or else nothing runs until the device's owner approves.
            grant = await access.grant_ticket(
                conn,
                ticket_id,
                await access.device(conn, device_id),
                await access.requester_of_trigger(conn, source_id),
                by="the router",
                what=f"{ticket_id} ({title[:100]})",
            )
            content["device_access"] = grant["rule"]
            if not access.covers(grant):
                content["waits_for_approval"] = {
                    "owner": grant["owner"],
                    "approval": grant["approval"],
                    "note": f"the device is {grant['owner']}'s: nothing runs until they "
                    "approve; they are asked on the request's thread",
                }
                outcome += f"; waits for {grant['owner']}'s approval ({grant['approval']})"
        return content, outcome, [source_id]

    async def _reply(
        self, conn: asyncpg.Connection, args: dict[str, Any], turn: Turn
    ) -> tuple[dict[str, Any], str, list[str]]:
        thread_id = _id(args, "thread", "thr")
        text = _str(args, "text", limit=MAX_REPLY_CHARS)
        thread = await conn.fetchrow(
            "SELECT source, external_id FROM threads WHERE id = $1", thread_id
        )
        if thread is None:
            raise Refused(f"no thread {thread_id}")
        words = word_count(text)
        if style_of(thread["source"]) is Style.im and words > IM_MAX_WORDS:
            raise Refused(
                f"{thread['source']} is a chat channel: at most {IM_MAX_WORDS} words, this "
                f"reply has {words}. Keep decisions, questions and results; put details in a "
                "GitHub comment or behind a link"
            )
        concerned = [
            row["id"]
            for row in await conn.fetch(
                "SELECT id FROM triggers WHERE id = ANY($1::text[]) AND thread_id = $2",
                list(turn.batch),
                thread_id,
            )
        ]
        text += await _spend_footer(conn, concerned, style_of(thread["source"]))
        # The n-th reply to a thread in the turn over a batch has one id: a turn that runs
        # again after its leader died sends each of its replies once (outbound dedupe).
        key = (turn.batch[0] if turn.batch else turn.llm_call_id or "", thread_id)
        if key[0] != self._replies_batch:  # a new turn: the old counts are done with
            self._replies.clear()
            self._replies_batch = key[0]
        nth = self._replies.get(key, 0)
        self._replies[key] = nth + 1
        reply_id = (
            stable_id("msg", f"reply:{key[0]}:{thread_id}:{nth}") if key[0] else new_id("msg")
        )
        await enqueue(
            conn,
            EffectKind.REPLY,
            reply_id,  # the outbound message's dedupe key: sent once however often retried
            {
                "reply_id": reply_id,
                "thread_id": thread_id,
                "source": thread["source"],
                "thread_external_id": thread["external_id"],
                "text": text,
            },
        )
        return {"queued": reply_id}, f"reply {reply_id} queued on {thread_id}", concerned

    async def _subscribe(
        self, conn: asyncpg.Connection, args: dict[str, Any], turn: Turn
    ) -> tuple[dict[str, Any], str, list[str]]:
        return await self._relate(conn, args, "subscriptions", "subscribed")

    async def _link(
        self, conn: asyncpg.Connection, args: dict[str, Any], turn: Turn
    ) -> tuple[dict[str, Any], str, list[str]]:
        return await self._relate(conn, args, "links", "linked")

    async def _relate(
        self, conn: asyncpg.Connection, args: dict[str, Any], table: str, done: str
    ) -> tuple[dict[str, Any], str, list[str]]:
        thread_id = _id(args, "thread", "thr")
        ticket_id = _id(args, "ticket", "tkt")
        await self._thread_ids(conn, [thread_id])
        await self._live_ticket(conn, ticket_id)
        await conn.execute(
            f"INSERT INTO {table} (thread_id, ticket_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            thread_id,
            ticket_id,
        )
        return {done: True}, f"{thread_id} {done} to {ticket_id}", []

    async def _explain(
        self, conn: asyncpg.Connection, args: dict[str, Any], turn: Turn
    ) -> tuple[dict[str, Any], str, list[str]]:
        ticket_id = _id(args, "ticket", "tkt")
        found = await explain.facts(self.pool, ticket_id)
        if found is None:
            raise Refused(f"no ticket {ticket_id}")
        return found, f"explained {ticket_id}", []

    async def _forward(
        self, conn: asyncpg.Connection, args: dict[str, Any], turn: Turn
    ) -> tuple[dict[str, Any], str, list[str]]:
        trigger_id = _id(args, "trigger", "trg")
        ticket_id = _id(args, "ticket", "tkt")
        await self._trigger(conn, trigger_id)
        await self._live_ticket(conn, ticket_id)
        await conn.execute(
            "INSERT INTO ticket_inbox (ticket_id, trigger_id) VALUES ($1, $2) "
            "ON CONFLICT DO NOTHING",
            ticket_id,
            trigger_id,
        )
        await conn.execute("SELECT pg_notify($1, $2)", Notify.INBOX, f"{trigger_id}:{ticket_id}")
        return {"forwarded": trigger_id, "to": ticket_id}, f"forwarded to {ticket_id}", [trigger_id]

    async def _stop_ticket(
        self, conn: asyncpg.Connection, args: dict[str, Any], turn: Turn
    ) -> tuple[dict[str, Any], str, list[str]]:
        ticket_id = _id(args, "ticket", "tkt")
        reason = _str(args, "reason", limit=2000)
        await self._live_ticket(conn, ticket_id)
        was = await control.stop(conn, ticket_id, by="the router")
        return {"stopped": ticket_id, "was": was}, f"stopped {ticket_id}: {reason}", []

    async def _ignore(
        self, conn: asyncpg.Connection, args: dict[str, Any], turn: Turn
    ) -> tuple[dict[str, Any], str, list[str]]:
        trigger_id = _id(args, "trigger", "trg")
        reason = _str(args, "reason", limit=2000)
        await self._trigger(conn, trigger_id)
        return {"ignored": trigger_id}, f"ignored: {reason}", [trigger_id]

    async def _assess(
        self, conn: asyncpg.Connection, args: dict[str, Any], turn: Turn
    ) -> tuple[dict[str, Any], str, list[str]]:
        trigger_id = _id(args, "trigger", "trg")
        trigger = await self._trigger(conn, trigger_id)
        if trigger["verdict"] != "candidate":
            raise Refused(f"{trigger_id} is not an inferred candidate ({trigger['verdict']})")
        raw = args.get("verdicts")
        if not isinstance(raw, list):
            raise Refused("verdicts must be a list of {rule, matches, why}")
        verdicts = []
        for item in raw:
            if not isinstance(item, dict) or not isinstance(item.get("rule"), str):
                raise Refused("each verdict needs a rule name, matches and why")
            if not isinstance(item.get("matches"), bool):
                raise Refused(f"verdict for {item['rule']}: matches must be true or false")
            verdicts.append(
                policies.RuleVerdict(item["rule"], item["matches"], str(item.get("why", "")))
            )
        assessment = policies.Assessment(
            verdicts=tuple(verdicts),
            intent=str(args.get("intent", "")),
            target=str(args.get("target", "")),
        )
        _, current = await self.policy.current()
        source = current.for_source(trigger["source"])
        accepts, why = policies.assessment_accepts(source, assessment)
        if source.inferred == "auto":
            outcome = "accepted" if accepts else "rejected"
            content = {"accepted": accepts, "why": why}
        else:
            # observe (or since turned off): on record, and nothing may come of it.
            outcome = "would accept" if accepts else "would not accept"
            content = {
                "accepted": False,
                "why": f"{why}; this source only observes inferred candidates",
            }
        return content, outcome, [trigger_id]

    async def _recall(
        self, conn: asyncpg.Connection, args: dict[str, Any], turn: Turn
    ) -> tuple[dict[str, Any], str, list[str]]:
        object_id = _str(args, "id", limit=100)
        prefix = id_prefix(object_id)
        if prefix == "trg":
            found = await recall_trigger(conn, object_id)
        elif prefix == "thr":
            found = await recall_thread(conn, object_id)
        elif prefix == "tkt":
            found = await recall_ticket(conn, object_id)
        else:
            raise Refused(f"recall takes a trg_, thr_ or tkt_ id, not {object_id!r}")
        if found is None:
            raise Refused(f"nothing with id {object_id}")
        return found, f"recalled {object_id}", []


async def _spend_footer(conn: asyncpg.Connection, trigger_ids: list[str], style: Style) -> str:
    """Every reply about a worker's result states what the ticket spent, whatever the
    model wrote (the numbers come from the reports, not from the model)."""
    rows = await conn.fetch(
        "SELECT DISTINCT ON (ticket_id) ticket_id, tokens, cost_usd FROM reports "
        "WHERE trigger_id = ANY($1::text[]) ORDER BY ticket_id, created_at DESC",
        trigger_ids,
    )
    parts = [f"{r['ticket_id']}: {Spent(r['tokens'], r['cost_usd']).line()}" for r in rows]
    if not parts:
        return ""
    if style is Style.structured:
        return "\n\n<sub>" + "; ".join(parts) + "</sub>"
    return " (" + "; ".join(parts) + ")"


def _snippet(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= SNIPPET_CHARS else text[: SNIPPET_CHARS - 1] + "…"


async def recall_trigger(conn: Conn, trigger_id: str) -> dict[str, Any] | None:
    row = await conn.fetchrow(
        "SELECT id, source, thread_id, actor_name, actor_is_bot, kind, text, verdict, "
        "created_at FROM triggers WHERE id = $1",
        trigger_id,
    )
    if row is None:
        return None
    tickets = await conn.fetch(
        "SELECT DISTINCT ticket_id FROM ticket_inbox WHERE trigger_id = $1 "
        "UNION SELECT ticket_id FROM mandates WHERE trigger_id = $1",
        trigger_id,
    )
    return {
        "id": row["id"],
        "source": row["source"],
        "thread": row["thread_id"],
        "from": row["actor_name"] + (" (bot)" if row["actor_is_bot"] else ""),
        "kind": row["kind"],
        "verdict": row["verdict"],
        "at": row["created_at"].isoformat(),
        "text": row["text"][:4000],
        "tickets": sorted(r["ticket_id"] for r in tickets),
    }


async def recall_thread(conn: Conn, thread_id: str) -> dict[str, Any] | None:
    row = await conn.fetchrow(
        "SELECT id, source, external_id, title, url FROM threads WHERE id = $1", thread_id
    )
    if row is None:
        return None
    recent = await conn.fetch(
        "SELECT id, actor_name, text FROM triggers WHERE thread_id = $1 "
        "ORDER BY created_at DESC, id DESC LIMIT 10",
        thread_id,
    )
    related = await conn.fetch(
        "SELECT ticket_id, 'handled by' AS how FROM subscriptions WHERE thread_id = $1 "
        "UNION ALL SELECT ticket_id, 'related to' FROM links WHERE thread_id = $1",
        thread_id,
    )
    return {
        "id": row["id"],
        "source": row["source"],
        "title": row["title"],
        "url": row["url"],
        "recent_events": [
            {"id": r["id"], "from": r["actor_name"], "text": _snippet(r["text"])}
            for r in reversed(recent)
        ],
        "tickets": [{"id": r["ticket_id"], "how": r["how"]} for r in related],
    }


async def recall_ticket(conn: Conn, ticket_id: str) -> dict[str, Any] | None:
    row = await conn.fetchrow(
        "SELECT t.id, t.title, t.state, t.pr_url, d.name AS device, m.kind AS mandate, "
        "m.scope, m.initiator_name, m.trigger_id, m.revoked_at "
        "FROM tickets t LEFT JOIN devices d ON d.id = t.device_id "
        "LEFT JOIN mandates m ON m.ticket_id = t.id WHERE t.id = $1 "
        "ORDER BY m.created_at DESC LIMIT 1",
        ticket_id,
    )
    if row is None:
        return None
    threads = await conn.fetch(
        "SELECT thread_id, 'handled by' AS how FROM subscriptions WHERE ticket_id = $1 "
        "UNION ALL SELECT thread_id, 'related to' FROM links WHERE ticket_id = $1",
        ticket_id,
    )
    return {
        "id": row["id"],
        "title": row["title"],
        "state": row["state"],
        "device": row["device"],
        "pull_request": row["pr_url"],
        "mandate": {
            "kind": row["mandate"],
            "from": row["initiator_name"],
            "trigger": row["trigger_id"],
            "scope": row["scope"],
            "revoked": row["revoked_at"] is not None,
        },
        "threads": [{"id": r["thread_id"], "how": r["how"]} for r in threads],
    }
