"""The router: one long-lived model session, run by the leader replica, one batch per turn.

A turn takes everything in the router's inbox (:mod:`controlplane.router.batch`), shows
it to the model, and runs the tool calls the model makes (:mod:`controlplane.router.tools`)
until it stops calling tools. Then it marks the batch routed. Events that arrive during a
slow model call wait and form the next turn's batch, together with everything else that
arrived by then.

No event ends in silence. Each of the batch must be decided by an accepted call (a ticket
resting on it, a reply, subscribe or link on its thread, ``ignore``, ``assess``,
``forward``, a stop of a ticket on its thread or named in it); one the turn
left undecided is not marked routed but fails (:class:`~controlplane.router.containment.
Undecided`), with the turn's last refusals as its reason. A model that stops with events
undecided is first told once, in the same turn, which they are and its last refusal (a
small model gives up after one refused call). The same call made
:data:`REPEAT_LIMIT` times in a row (the workers' rule, :func:`controlplane.llm.transcript.
looping`) ends the turn at once: a small model that keeps making a refused call gets the
same refusal every time.

Nothing is marked routed until its turn is over. If the model fails, or the leader dies
mid-turn, the batch stays in the inbox and the next turn sees it again: at-least-once,
with every decision on record (``router_decisions``, ``llm_calls``).

Fault containment (:mod:`controlplane.router.containment`): a turn that fails raises
:class:`TurnFailed`, naming the triggers it held, and the service
(:mod:`controlplane.router.service`) never ends for it. The failure counts against those
triggers (a poison one is isolated, then set aside as undecidable) or against nobody (the
model unreachable, the database away).

Bounded context (:mod:`controlplane.router.context`): the system prompt, a summary of
older turns, the last turns in full, compacted by turn count and by size. A
``ContextExceeded`` answer compacts everything held and tries the call once more. How far
compaction went is persisted with each turn, so a new leader replaying the session
(:meth:`Router._resume`) rebuilds the same context.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

import asyncpg
import openai

from controlplane import prompts
from controlplane.ingest.intake import AdmissionSource
from controlplane.llm import Accounting, LlmClient, sessions
from controlplane.llm.client import Answer, screen_calls
from controlplane.llm.errors import ContextExceeded
from controlplane.llm.transcript import canonical_arguments, looping
from controlplane.router import batch as batches
from controlplane.router.containment import Undecided
from controlplane.router.context import Conversation, TurnRecord
from controlplane.router.spending import TurnSpend
from controlplane.router.tools.core import Turn
from controlplane.router.tools.toolbox import SUBAGENT_SPEC, TOOL_SPECS, SubagentRunner, Toolbox
from controlplane.settings import LlmSettings

log = logging.getLogger(__name__)

MAX_STEPS = 8  # model calls per turn: the model may call tools, read results, call again
READ_RESULTS = frozenset(
    {"recall", "assess", "subagent", "explain"}
)  # tools whose results the model acts on
RESUME_TURNS = 300  # turns a new leader replays from the session (the rest is summarised)
REPEAT_LIMIT = 3  # the same call this many times in a row ends a turn (workers.repeat_limit)
REFUSALS_SHOWN = 3  # of a turn's last refusals, named in an undecided trigger's reason


class LostLeadership(Exception):
    """This replica's lease ran out during a turn."""


class TurnFailed(Exception):
    """A turn over ``trigger_ids`` failed with ``cause``; the batch is still in the inbox."""

    def __init__(
        self,
        trigger_ids: Sequence[str],
        cause: Exception,
        digest: Sequence[str] = (),
        *,
        alone: bool | None = None,
    ) -> None:
        super().__init__(f"the turn over {', '.join(trigger_ids)} failed: {cause}")
        self.trigger_ids = list(trigger_ids)
        self.cause = cause
        self.digest = list(digest)  # the pass-through events the turn listed
        # Whether the turn held this trigger alone: only then can the failure be its own
        # (one left undecided by a turn over several is tried alone first).
        self.alone = len(self.trigger_ids) == 1 if alone is None else alone


class Router:
    """Runs turns. Only the leader's :class:`~controlplane.router.service.RouterService`
    calls :meth:`turn`."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        client: openai.AsyncOpenAI,
        model: str,
        *,
        policy: AdmissionSource | None = None,
        subagent: SubagentRunner | None = None,
        llm: LlmSettings | None = None,
    ) -> None:
        self.pool = pool
        self.llm = LlmClient(pool, client, llm)
        self.model = model
        self.policy = policy or AdmissionSource(pool)
        self.tools = Toolbox(pool, self.policy, subagent)
        self.tool_specs = TOOL_SPECS + ([SUBAGENT_SPEC] if subagent is not None else [])
        self.conversation: Conversation | None = None
        self.session_id: str | None = None
        self._prompt_version: str | None = None
        self._turns = 0  # turns in this session so far (persisted with each message)
        self._seq = 0  # the session's last message seq

    async def _prepare(self) -> Conversation:
        """The system prompt's current version; a new one starts a fresh conversation."""
        row = await self.pool.fetchrow(
            "SELECT id, body FROM prompt_versions WHERE name = 'router' "
            "ORDER BY version DESC LIMIT 1"
        )
        version, text = (row["id"], row["body"]) if row else (None, prompts.DEFAULTS["router"])
        if self.conversation is not None and version == self._prompt_version:
            return self.conversation
        self._prompt_version = version
        self.conversation = Conversation(system=text, budget=await self._budget())
        if await self._resume(version):
            return self.conversation
        self._turns = self._seq = 0
        self.session_id = await sessions.start(
            self.pool, "router", self.model, prompt_version_id=version
        )
        return self.conversation

    async def _budget(self) -> int:
        """Tokens a prompt may have before it is compacted."""
        window = await self.llm.context_tokens(self.model, "router")
        return int(window * self.llm.settings.compact_share)

    async def _resume(self, version: str | None) -> bool:
        """Take over the latest router session of this model and prompt (a new leader, a
        restart): its turns are replayed, compaction included, so the context, and with it
        the provider's cached prefix, is what the last leader had."""
        assert self.conversation is not None
        session_id = await self.pool.fetchval(
            "SELECT id FROM sessions WHERE kind = 'router' AND model = $1 "
            "AND prompt_version_id IS NOT DISTINCT FROM $2 "
            "ORDER BY updated_at DESC, created_at DESC LIMIT 1",
            self.model,
            version,
        )
        if session_id is None:
            return False
        rows = await self.pool.fetch(
            "SELECT seq, content FROM session_messages WHERE session_id = $1 "
            "AND (content->>'turn')::int > (SELECT coalesce(max((content->>'turn')::int), 0) "
            "  FROM session_messages WHERE session_id = $1) - $2 "
            "ORDER BY seq",
            session_id,
            RESUME_TURNS,
        )
        turns: dict[int, TurnRecord] = {}
        for row in rows:
            content = row["content"]
            if isinstance(content, str):
                content = json.loads(content)
            number = int(content["turn"])
            record = turns.setdefault(number, TurnRecord([], "", number))
            record.messages.append(content["message"])
            if "summary" in content:
                record.summary = content["summary"]
            marks = content.get("compaction")
            if isinstance(marks, list) and len(marks) == 2:
                record.compaction = (int(marks[0]), int(marks[1]))
        for number in sorted(turns):
            record = turns[number]
            if record.compaction is not None:  # as far as the last leader had compacted
                self.conversation.compact_to(*record.compaction)
            self.conversation.add(record)
        self.session_id = session_id
        self._turns = max(turns, default=0)
        self._seq = rows[-1]["seq"] if rows else 0
        log.info("router: resumed session %s at turn %d", session_id, self._turns)
        return True

    async def _persist(
        self, messages: list[dict[str, Any]], summary: str, marks: tuple[int, int]
    ) -> int:
        """The turn's messages, in order, before its batch counts as routed: a leader that
        dies in between leaves a successor that sees the turn and the batch again.

        With the last message: the turn's summary and how far the context was compacted
        (``marks``), for a successor's replay. Returns the turn's number."""
        self._turns += 1
        contents = []
        for index, message in enumerate(messages):
            content: dict[str, Any] = {"turn": self._turns, "message": message}
            if index == len(messages) - 1:
                content["summary"] = summary
                content["compaction"] = list(marks)
            contents.append(json.dumps(content, default=str))
        first = self._seq + 1
        self._seq += len(messages)
        assert self.session_id is not None  # _prepare started one
        await sessions.append(
            self.pool,
            self.session_id,
            first,
            [str(m.get("role", "user")) for m in messages],
            contents,
            prompt_version_id=self._prompt_version,
        )
        return self._turns

    async def turn(self, leading: Callable[[], bool] = lambda: True) -> int:
        """One turn over everything waiting; returns how many events it consumed.

        ``leading`` is asked before anything is written: a replica that lost its lease
        mid-turn stops (LostLeadership), leaving the batch to the new leader. Anything else
        that goes wrong raises :class:`TurnFailed`, naming the batch.
        """
        batch = await batches.take(self.pool)
        if not batch:
            return 0  # a digest alone waits for the next turn that has events to decide
        try:
            return await self._decide(batch, leading)
        except (LostLeadership, TurnFailed):
            raise
        except Exception as exc:
            raise TurnFailed(batch.trigger_ids, exc, [e.id for e in batch.digest]) from exc

    async def _call(
        self, messages: list[dict[str, Any]], batch: batches.Batch, policy_version: str | None
    ) -> Answer:
        return await self.llm.complete(
            model=self.model,
            messages=messages,
            tools=self.tool_specs,
            max_tokens=self.llm.settings.router_max_tokens,
            accounting=Accounting(
                self.session_id,
                batch_size=len(batch.events),
                prompt_version_id=self._prompt_version,
                policy_version_id=policy_version,
            ),
        )

    async def _decide(self, batch: batches.Batch, leading: Callable[[], bool]) -> int:
        conversation = await self._prepare()
        conversation.budget = await self._budget()
        policy_version, _ = await self.policy.current()
        pending: list[dict[str, Any]] = [{"role": "user", "content": batches.render(batch)}]
        decisions: list[str] = []
        decided: set[str] = set()
        signatures: list[str] = []  # every call of the turn, for the repeat rule
        refusals: list[str] = []
        stuck: str | None = None
        compacted_hard = False
        reminded = False
        spend = TurnSpend()
        for _step in range(MAX_STEPS):
            # A failed call raises (an LlmError): the batch stays queued for a later turn.
            messages = conversation.fit(pending, self.tool_specs)
            try:
                answer = await self._call(messages, batch, policy_version)
            except ContextExceeded:
                if compacted_hard or not conversation.compact_hard():
                    raise  # the batch itself is too big: it fails, and is then isolated
                compacted_hard = True
                log.warning(
                    "router: the prompt did not fit the model's window; every held turn "
                    "is compacted, trying once more"
                )
                answer = await self._call(conversation.messages(pending), batch, policy_version)
            spend.answered(answer)
            llm_call_id = answer.llm_call_id
            calls = answer.tool_calls
            pending.append(answer.message())
            if not calls:
                undecided = [t for t in batch.trigger_ids if t not in decided]
                if undecided and not reminded:
                    # A small model stops after a refusal: tell it once what is left.
                    reminded = True
                    pending.append(
                        {"role": "user", "content": _reminder(batch, undecided, refusals)}
                    )
                    continue
                break
            turn = Turn(self.session_id, llm_call_id, tuple(batch.trigger_ids))
            # The same call twice in one answer runs once, so it counts once.
            signatures += dict.fromkeys(
                f"{c.name}:{canonical_arguments(c.arguments)}" for c in calls
            )
            name = looping(signatures, REPEAT_LIMIT)
            if name is not None:
                stuck = f"the same {name} call {REPEAT_LIMIT} times in a row"
            settled = True  # every call done and nothing in its result to read
            for call, refusal in screen_calls(calls):
                if stuck is not None:
                    refusal = f"not run: {stuck}"  # the same answer again, the turn ends
                elif refusal is not None:
                    refusals.append(f"{call.name}: {refusal}")
                if refusal is not None:
                    settled = False
                    pending.append(
                        {
                            "role": "tool",
                            "tool_call_id": call.id,
                            "content": json.dumps({"error": refusal}),
                        }
                    )
                    continue
                if not leading():
                    raise LostLeadership
                result = await self.tools.call(call.name, call.arguments, turn)
                settled = settled and result.ok and call.name not in READ_RESULTS
                decided.update(result.decided)
                spend.acted(call, result)
                if not result.ok:
                    refusals.append(f"{call.name} refused: {result.content.get('error')}")
                decisions.append(f"{call.name}: {_short(result.content)}")
                pending.append(
                    {"role": "tool", "tool_call_id": call.id, "content": result.as_message()}
                )
            if stuck is not None:
                break
            if settled:
                # No model call just to acknowledge: the results are in the history, and
                # a refusal or a recall/assess result is what the model would act on.
                break
        if not leading():
            raise LostLeadership
        summary = "\n".join(
            [f"turn of {', '.join(batch.trigger_ids)}:"] + [f"  {d}" for d in decisions]
        )
        undecided = [t for t in batch.trigger_ids if t not in decided]
        if undecided:
            summary += "\n  left undecided: " + ", ".join(undecided)
        marks = conversation.marks
        number = await self._persist(pending, summary, marks)
        await spend.charge(self.pool)
        await batches.mark_routed(self.pool, batch, [t for t in batch.trigger_ids if t in decided])
        conversation.add(TurnRecord(pending, summary, number, marks))
        if undecided:
            # Not routed in silence: each fails, is tried alone, then set aside with this
            # reason, and an explicit request is answered (containment).
            raise TurnFailed(
                undecided,
                Undecided(_why(stuck, refusals)),
                alone=len(batch.events) == 1,
            )
        return len(batch.events)


def _reminder(batch: batches.Batch, undecided: list[str], refusals: list[str]) -> str:
    """The one message a turn adds when the model stops with events undecided."""
    events = {event.id: event for event in batch.events}
    named = ", ".join(
        f"{t} ({events[t].verdict} from {events[t].actor_name}, on {events[t].thread_id})"
        for t in undecided
    )
    text = (
        f"Still undecided: {named}. Decide each with a tool call: create_ticket for work, "
        "reply on its thread, or ignore one that asks nothing of you."
    )
    if refusals:
        text += f" Your last refused call: {refusals[-1]}"
    return text


def _why(stuck: str | None, refusals: list[str]) -> str:
    """What the turn did instead of deciding, in a line: the loop, the last refusals."""
    parts = [stuck] if stuck else []
    last = list(dict.fromkeys(reversed(refusals)))[:REFUSALS_SHOWN]
    if last:
        parts.append("refused: " + "; ".join(reversed(last)))
    return "; ".join(parts) or "no call decided it"


def _short(content: dict[str, Any]) -> str:
    text = json.dumps(content, ensure_ascii=False, default=str)
    return text if len(text) <= 160 else text[:159] + "…"
