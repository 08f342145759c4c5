"""The router: one long-lived model session, run by the leader replica, one batch per turn.

A turn takes everything in the router's inbox (:mod:`controlplane.router.batch`), shows
it to the model, and runs the tool calls the model makes (:mod:`controlplane.router.tools`)
until it stops calling tools. Then it marks the batch routed. Events that arrive during a
slow model call wait and form the next turn's batch, together with everything else that
arrived by then.

Nothing is marked routed until its turn is over. If the model fails, or the leader dies
mid-turn, the batch stays in the inbox and the next turn sees it again: at-least-once,
with every decision on record (``router_decisions``, ``llm_calls``).

Fault containment. A turn that fails raises :class:`TurnFailed`, naming the triggers it
held; the service never ends for it. What the failure costs depends on whose it is:

* the batch's (a malformed answer, a request the provider rejected (400), a prompt too
  long even after compaction, an exception in our own code): each trigger's
  ``route_attempts`` goes up, with the reason in ``route_error`` and an ``item_failures``
  row. Triggers that failed once are then taken alone (the batch module's isolation), so
  the good events of a batch are decided in the next turns; a trigger whose lone turn
  fails ``router.quarantine_after`` times is set aside *undecidable* (routed, with
  ``undecidable_at``), the admin told once; ``superagent triggers retry`` puts it back.
* nobody's (the model unreachable: a transient failure after the client's retries, a bad
  key or unknown model (401, 403, 404), a quota; or the database gone): nothing is
  counted. After ``router.model_notice_seconds`` of an unreachable model, each thread
  waiting with an explicit request is told once that its message is queued, and the admin
  once per outage episode.

Bounded context. The conversation is the system prompt, then one summary of compacted
older turns, then the last turns in full. Compaction happens in steps of several turns, so
the prefix (prompt, tools, summary) stays byte-identical across most calls, and providers'
prefix caches hit. Besides the turn count, the size is bounded: before each model call the
prompt's tokens are estimated (characters of the JSON of the messages and tools, over 4:
a deliberate overestimate for English, close for code and IDs) and, past
``llm.router_context_tokens * llm.compact_share``, compacted in steps: old tool outputs
are cut to their head and tail (with the IDs they named, for recall), then older turns go
into the summary (the last ones stay verbatim), then all of them. The summary itself is
bounded in lines and characters. A ``ContextExceeded`` answer compacts everything held and
tries the call once more. How far compaction went is persisted with each turn, so a new
leader replaying the session (:meth:`Router._resume`) rebuilds the same context.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import asyncpg
import openai

from controlplane import failures, pause, prompts
from controlplane.alerts import alert_admin
from controlplane.channels.outbound import enqueue_reply
from controlplane.db import outage
from controlplane.ingest.intake import ROUTER_CHANNEL, PolicySource
from controlplane.leadership import Leadership
from controlplane.llm import Accounting, LlmClient, LlmError
from controlplane.llm.client import Answer, screen_calls
from controlplane.llm.errors import ContextExceeded, Permanent, Transient
from controlplane.router import batch as batches
from controlplane.router.tools import (
    SUBAGENT_SPEC,
    TOOL_SPECS,
    SubagentRunner,
    Toolbox,
    Turn,
)
from controlplane.services import Service, sleep_unless
from controlplane.settings import LlmSettings, RouterSettings, Settings
from superagent_shared.ids import new_id, new_ids, stable_id

log = logging.getLogger(__name__)

MAX_STEPS = 8  # model calls per turn: the model may call tools, read results, call again
READ_RESULTS = frozenset(
    {"recall", "assess", "subagent", "explain"}
)  # tools whose results the model acts on
KEEP_TURNS = 6  # turns kept in full; older ones are compacted
COMPACT_AT = 10  # compaction happens once this many turns are held
POLL_SECONDS = 1.0  # the safety net under LISTEN
RESUME_TURNS = 300  # turns a new leader replays from the session (the rest is summarised)
MAX_BACKOFF = 30.0
CHARS_PER_TOKEN = 4  # the estimate of a prompt's tokens: characters of its JSON over this
CLIP_HEAD = CLIP_TAIL = 500  # characters of a compacted tool output kept at each end
CLIP_OVER = CLIP_HEAD + CLIP_TAIL + 600  # tool outputs up to this long stay whole
CLIP_IDS = 20  # IDs named in a cut tool output, kept for recall
VERBATIM_TURNS = 2  # turns a size compaction keeps in full
SUMMARY_LINES = 200
SUMMARY_CHARS = 8000  # at most; a quarter of the budget when that is less
LINE_CHARS = 300  # characters of one summary line
# Model failures that are the deployment's, not the batch's: a bad key, no access, an
# unknown model, a quota or bill (with Transient, "the model is unreachable").
UNREACHABLE_STATUSES = frozenset({401, 402, 403, 404, 429})
MODEL_NOTICE = (
    "I can't reach my model right now; your message is queued and I'll answer as soon as it's back."
)
_IDS = re.compile(r"\b(?:trg|tkt|thr|blb|cmd)_[0-9a-z]{12}\b")


class LostLeadership(Exception):
    """This replica's lease ran out during a turn."""


class TurnFailed(Exception):
    """A turn over ``trigger_ids`` failed with ``cause``; the batch is still in the inbox."""

    def __init__(
        self, trigger_ids: Sequence[str], cause: Exception, digest: Sequence[str] = ()
    ) -> None:
        super().__init__(f"the turn over {', '.join(trigger_ids)} failed: {cause}")
        self.trigger_ids = list(trigger_ids)
        self.cause = cause
        self.digest = list(digest)  # the pass-through events the turn listed


def estimate_tokens(messages: Sequence[dict[str, Any]], tools: Sequence[Any]) -> int:
    """The prompt's tokens, estimated: characters of its JSON (ASCII-escaped, so a
    non-Latin character counts as several) over :data:`CHARS_PER_TOKEN`."""
    text = json.dumps([list(messages), list(tools)], default=str)
    return -(-len(text) // CHARS_PER_TOKEN)


def clip_output(text: str) -> str:
    """A long tool output as its head and tail, and the IDs it named (to recall them)."""
    if len(text) <= CLIP_OVER:
        return text
    ids = list(dict.fromkeys(_IDS.findall(text)))[:CLIP_IDS]
    recall = f"; recall {', '.join(ids)} for details" if ids else ""
    cut = len(text) - CLIP_HEAD - CLIP_TAIL
    return f"{text[:CLIP_HEAD]} …[{cut} characters cut{recall}]… {text[-CLIP_TAIL:]}"


def _reduced(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if message.get("role") != "tool" or not isinstance(content, str):
        return message
    return {**message, "content": clip_output(content)}


@dataclass
class _TurnRecord:
    messages: list[dict[str, Any]]
    summary: str  # one line per decision, for compaction
    number: int = 0  # the turn's number in its session
    # How far the conversation was compacted by this turn's last model call
    # (reduced_through, summarized_through), persisted with the turn.
    compaction: tuple[int, int] | None = None


@dataclass
class Conversation:
    """The router's bounded context (kept by the leader; rebuilt by a new one).

    Compaction is described by two turn numbers, both only ever raised: held turns up to
    ``reduced_through`` have their long tool outputs cut; turns up to
    ``summarized_through`` are summary lines. Replaying the same turns with the same
    marks gives the same context.
    """

    system: str
    budget: int | None = None  # tokens a prompt may have; None: no size bound
    summary: list[str] = field(default_factory=list)
    turns: list[_TurnRecord] = field(default_factory=list)
    reduced_through: int = 0
    summarized_through: int = 0

    @property
    def marks(self) -> tuple[int, int]:
        return self.reduced_through, self.summarized_through

    def messages(self, pending: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"role": "system", "content": self.system}]
        if self.summary:
            out.append(
                {
                    "role": "user",
                    "content": "Earlier turns, compacted (recall any ID for details):\n"
                    + "\n".join(self.summary),
                }
            )
            out.append({"role": "assistant", "content": "Noted."})
        for turn in self.turns:
            out.extend(turn.messages)
        out.extend(pending)
        return out

    def add(self, record: _TurnRecord) -> None:
        self.turns.append(record)
        if len(self.turns) >= COMPACT_AT:
            self.compact_to(summarized=self.turns[-KEEP_TURNS - 1].number)

    def compact_to(self, reduced: int = 0, summarized: int = 0) -> bool:
        """Raise the marks to ``reduced`` and ``summarized``; False: nothing changed."""
        changed = False
        if summarized > self.summarized_through:
            old = [turn for turn in self.turns if turn.number <= summarized]
            self.turns = [turn for turn in self.turns if turn.number > summarized]
            self.summarized_through = summarized
            self._summarize(old)
            changed = changed or bool(old)
        if reduced > self.reduced_through:
            for turn in self.turns:
                if self.reduced_through < turn.number <= reduced:
                    before = turn.messages
                    turn.messages = [_reduced(message) for message in before]
                    changed = changed or turn.messages != before
            self.reduced_through = reduced
        return changed

    def _summarize(self, old: list[_TurnRecord]) -> None:
        for turn in old:
            self.summary.extend(_line(line) for line in turn.summary.splitlines())
        # The longest tail within both bounds: the same lines however the turns came in.
        cap = SUMMARY_CHARS
        if self.budget is not None:
            cap = min(cap, self.budget * CHARS_PER_TOKEN // 4)
        kept = self.summary[-SUMMARY_LINES:]
        total = sum(len(line) + 1 for line in kept)
        while kept and total > cap:
            total -= len(kept.pop(0)) + 1
        self.summary = kept

    def fit(self, pending: list[dict[str, Any]], tools: Sequence[Any]) -> list[dict[str, Any]]:
        """The messages for the next call, compacted first if they would pass the budget:
        old tool outputs cut, then older turns summarised, then every held turn."""
        out = self.messages(pending)
        if self.budget is None or estimate_tokens(out, tools) <= self.budget or not self.turns:
            return out
        last = self.turns[-1].number
        steps = [(last, 0)]
        if len(self.turns) > VERBATIM_TURNS:
            steps.append((last, self.turns[-VERBATIM_TURNS - 1].number))
        steps.append((last, last))
        for reduced, summarized in steps:
            if self.compact_to(reduced, summarized):
                out = self.messages(pending)
                if estimate_tokens(out, tools) <= self.budget:
                    break
        return out

    def compact_hard(self) -> bool:
        """Every held turn into the summary (the prompt did not fit); False: none held."""
        if not self.turns:
            return False
        last = self.turns[-1].number
        return self.compact_to(last, last)


def _line(text: str) -> str:
    return text if len(text) <= LINE_CHARS else text[: LINE_CHARS - 1] + "…"


class Router:
    """Runs turns. Only the leader's RouterService calls :meth:`turn`."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        client: openai.AsyncOpenAI,
        model: str,
        *,
        policy: PolicySource | None = None,
        subagent: SubagentRunner | None = None,
        llm: LlmSettings | None = None,
    ) -> None:
        self.pool = pool
        self.llm = LlmClient(pool, client, llm)
        self.model = model
        self.policy = policy or PolicySource(pool)
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
        self.conversation = Conversation(system=text, budget=self._budget())
        if await self._resume(version):
            return self.conversation
        self.session_id = new_id("ses")
        self._turns = self._seq = 0
        await self.pool.execute(
            "INSERT INTO sessions (id, kind, model, prompt_version_id) "
            "VALUES ($1, 'router', $2, $3)",
            self.session_id,
            self.model,
            version,
        )
        return self.conversation

    def _budget(self) -> int:
        """Tokens a prompt may have before it is compacted."""
        settings = self.llm.settings
        return int(settings.router_context_tokens * settings.compact_share)

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
        turns: dict[int, _TurnRecord] = {}
        for row in rows:
            content = row["content"]
            if isinstance(content, str):
                content = json.loads(content)
            number = int(content["turn"])
            record = turns.setdefault(number, _TurnRecord([], "", number))
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
        await self.pool.execute(
            "INSERT INTO session_messages (id, session_id, seq, role, content, "
            "prompt_version_id) "
            "SELECT i, $1, s, r, c::jsonb, $6 "
            "FROM unnest($2::text[], $3::int[], $4::text[], $5::text[]) AS m(i, s, r, c)",
            self.session_id,
            new_ids("msg", len(messages)),
            list(range(first, self._seq + 1)),
            [str(m.get("role", "user")) for m in messages],
            contents,
            self._prompt_version,
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
        except LostLeadership:
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
            accounting=Accounting(
                self.session_id,
                batch_size=len(batch.events),
                prompt_version_id=self._prompt_version,
                policy_version_id=policy_version,
            ),
        )

    async def _decide(self, batch: batches.Batch, leading: Callable[[], bool]) -> int:
        conversation = await self._prepare()
        conversation.budget = self._budget()
        policy_version, _ = await self.policy.current()
        pending: list[dict[str, Any]] = [{"role": "user", "content": batches.render(batch)}]
        decisions: list[str] = []
        compacted_hard = False
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
            llm_call_id = answer.llm_call_id
            calls = answer.tool_calls
            pending.append(answer.message())
            if not calls:
                break
            turn = Turn(self.session_id, llm_call_id, tuple(batch.trigger_ids))
            settled = True  # every call done and nothing in its result to read
            for call, refusal in screen_calls(calls):
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
                decisions.append(f"{call.name}: {_short(result.content)}")
                pending.append(
                    {"role": "tool", "tool_call_id": call.id, "content": result.as_message()}
                )
            if settled:
                # No model call just to acknowledge: the results are in the history, and
                # a refusal or a recall/assess result is what the model would act on.
                break
        if not leading():
            raise LostLeadership
        summary = "\n".join(
            [f"turn of {', '.join(batch.trigger_ids)}:"] + [f"  {d}" for d in decisions]
        )
        marks = conversation.marks
        number = await self._persist(pending, summary, marks)
        await batches.mark_routed(self.pool, batch)
        conversation.add(_TurnRecord(pending, summary, number, marks))
        return len(batch.events)


def _short(content: dict[str, Any]) -> str:
    text = json.dumps(content, ensure_ascii=False, default=str)
    return text if len(text) <= 160 else text[:159] + "…"


class TurnTaker(Protocol):
    async def turn(self, leading: Callable[[], bool] = ...) -> int: ...


class RouterService(Service):
    """Runs router turns while this replica leads, woken by NOTIFY with a 1 s poll.

    The turns are the model's (:class:`Router`) or, without a model, rules-only mode's
    (:class:`controlplane.router.rules_only.RulesOnlyRouter`). A failed turn is its
    batch's failure or nobody's (see the module's docstring), never the loop's.
    """

    name = "router"

    def __init__(
        self,
        router: TurnTaker,
        leadership: Leadership,
        dsn: str,
        pool: asyncpg.Pool,
        *,
        settings: Settings | None = None,
        retry_base: float = 1.0,
        max_backoff: float = MAX_BACKOFF,
    ) -> None:
        super().__init__()
        self.router = router
        self.pool = pool
        self.leadership = leadership
        self.dsn = dsn
        self.settings = settings.router if settings is not None else RouterSettings()
        self.admin_thread = settings.watchdog.admin_thread if settings is not None else None
        self.retry_base = retry_base
        self.max_backoff = max_backoff
        self._wake = asyncio.Event()
        # Since when the model has been unreachable (monotonic), and whether the admin was
        # told. In memory on purpose: the notices themselves are on record (model_notice_at,
        # stable message ids), so a new leader only starts its own clock.
        self._unreachable_since: float | None = None
        self._unreachable_alerted = False

    async def run(self) -> None:
        listener: asyncpg.Connection | None = None
        backoff = self.retry_base
        try:
            while not self.stopping.is_set():
                if not self.leadership.is_leader:
                    await sleep_unless(self.stopping, 0.2)
                    continue
                try:
                    paused = await pause.current(self.pool)
                except (asyncpg.PostgresError, OSError) as exc:
                    if not await outage.absorbed(exc, "router"):  # an outage is logged once
                        log.warning("router: cannot read the pause flag (%s)", exc)
                    paused = None
                if paused is not None:
                    await sleep_unless(self.stopping, POLL_SECONDS)  # events wait in the inbox
                    continue
                if listener is None or listener.is_closed():
                    listener = await self._listen()
                self._wake.clear()
                try:
                    consumed = await self.router.turn(lambda: self.leadership.is_leader)
                except LostLeadership:
                    log.warning("router: leadership lost mid-turn; the batch stays queued")
                    continue
                except TurnFailed as failed:
                    if await self._failed(failed, backoff):
                        backoff = self.retry_base  # set aside: the next turn is another's
                    await sleep_unless(self.stopping, backoff)
                    backoff = min(backoff * 2, self.max_backoff)
                    continue
                except (openai.OpenAIError, asyncpg.PostgresError, OSError) as exc:
                    # Before any batch was taken: the database, most likely.
                    if not await outage.absorbed(exc, "router"):
                        log.warning("router turn failed (%s); retrying in %.0fs", exc, backoff)
                    await sleep_unless(self.stopping, backoff)
                    backoff = min(backoff * 2, self.max_backoff)
                    continue
                except Exception:
                    log.exception("router: a turn failed before taking its batch (a bug)")
                    await sleep_unless(self.stopping, backoff)
                    backoff = min(backoff * 2, self.max_backoff)
                    continue
                backoff = self.retry_base
                if consumed:
                    self._reachable()
                    continue  # more may have arrived during the model call
                stop = asyncio.ensure_future(self.stopping.wait())
                wake = asyncio.ensure_future(self._wake.wait())
                await asyncio.wait(
                    {stop, wake}, timeout=POLL_SECONDS, return_when=asyncio.FIRST_COMPLETED
                )
                for waiter in (stop, wake):
                    waiter.cancel()
        finally:
            if listener is not None:
                await listener.close()

    async def _failed(self, failed: TurnFailed, backoff: float) -> bool:
        """Account for a failed turn; True: its trigger was set aside as undecidable.

        Never raises for an Exception: recording the failure may fail too (the database
        is gone), and then the batch is simply still queued.
        """
        cause = failed.cause
        try:
            if model_unreachable(cause):
                await self._unreachable(cause, backoff)
                return False
            if infrastructure(cause):
                if not await outage.absorbed(cause, "router"):
                    log.warning(
                        "router turn failed (%s); the batch stays queued, retrying in %.0fs",
                        failures.describe(cause),
                        backoff,
                    )
                return False
            if isinstance(cause, LlmError):
                self._reachable()  # it answered, if badly
            return await self._count(failed, backoff)
        except (asyncpg.PostgresError, OSError) as exc:
            if not await outage.absorbed(exc, "router"):
                log.warning("router: cannot record a failed turn (%s); it stays queued", exc)
        except Exception:
            log.exception("router: cannot record a failed turn; it stays queued")
        return False

    async def _count(self, failed: TurnFailed, backoff: float) -> bool:
        """The failure counts against the batch's triggers; one alone past
        ``router.quarantine_after`` attempts is set aside, the admin told, in one
        transaction."""
        cause = failed.cause
        error = failures.describe(cause)
        ids = failed.trigger_ids
        item_id = _item_id(ids)
        async with self.pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                "UPDATE triggers SET route_attempts = route_attempts + 1, route_error = $2 "
                "WHERE id = ANY($1::text[]) AND routed_at IS NULL "
                "RETURNING id, thread_id, route_attempts",
                ids,
                error,
            )
            if failed.digest:
                # Listed for information only: a digest never fails a second turn.
                await conn.execute(
                    "UPDATE triggers SET digested_at = now() WHERE id = ANY($1::text[]) "
                    "AND digested_at IS NULL",
                    failed.digest,
                )
            quarantined = (
                len(ids) == 1
                and len(rows) == 1
                and rows[0]["route_attempts"] >= self.settings.quarantine_after
            )
            if quarantined:
                trigger_id, attempts = rows[0]["id"], rows[0]["route_attempts"]
                await conn.execute(
                    "UPDATE triggers SET routed_at = now(), undecidable_at = now() WHERE id = $1",
                    trigger_id,
                )
                thread = await conn.fetchrow(
                    "SELECT id, source, external_id FROM threads WHERE id = $1",
                    rows[0]["thread_id"],
                )
                where = (
                    f"{thread['id']} ({thread['source']}:{thread['external_id']})"
                    if thread is not None
                    else str(rows[0]["thread_id"])
                )
                await alert_admin(
                    conn,
                    self.admin_thread,
                    f"undecidable:{trigger_id}",
                    f"The router set event {trigger_id} on thread {where} aside as "
                    f"undecidable after {attempts} failed turns: {error}. Once the cause "
                    f"is fixed, `superagent triggers retry {trigger_id}` puts it back.",
                )
            await failures.record(conn, "router", item_id, cause, quarantined=quarantined)
        if quarantined:
            then = "set aside as undecidable; the admin is told"
        elif len(ids) == 1:
            then = f"it stays queued, retrying in {backoff:.1f}s"
        else:
            then = f"each is tried alone next, in {backoff:.1f}s"
        failures.logged(log, "router", item_id, cause, then)
        return quarantined

    async def _unreachable(self, cause: Exception, backoff: float) -> None:
        """Nobody's fault: nothing counted. Past ``router.model_notice_seconds``, each
        waiting thread is told once, and the admin once per outage episode."""
        now = time.monotonic()
        if self._unreachable_since is None:
            self._unreachable_since = now
        waited = now - self._unreachable_since
        log.warning(
            "router turn failed: the model is unreachable (%s) for %.0fs; the batch stays "
            "queued and counts against nobody, retrying in %.1fs",
            failures.describe(cause),
            waited,
            backoff,
        )
        if waited < self.settings.model_notice_seconds:
            return
        async with self.pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                "SELECT thread_id, (array_agg(id ORDER BY created_at, id))[1] AS first "
                "FROM triggers WHERE routed_at IS NULL GROUP BY thread_id "
                "HAVING bool_or(verdict = 'explicit') AND NOT bool_or(model_notice_at IS NOT NULL) "
                "ORDER BY min(created_at), thread_id"
            )
            for row in rows:
                await enqueue_reply(
                    conn,
                    row["thread_id"],
                    MODEL_NOTICE,
                    stable_id("msg", f"model-unreachable:{row['first']}"),
                )
            if rows:
                await conn.execute(
                    "UPDATE triggers SET model_notice_at = now() WHERE routed_at IS NULL "
                    "AND model_notice_at IS NULL AND thread_id = ANY($1::text[])",
                    [row["thread_id"] for row in rows],
                )
            if not self._unreachable_alerted:
                # Keyed by the oldest waiting event: a new leader in the same outage
                # raises the same alert, which is one message.
                oldest = await conn.fetchval(
                    "SELECT id FROM triggers WHERE routed_at IS NULL "
                    "ORDER BY created_at, id LIMIT 1"
                )
                await alert_admin(
                    conn,
                    self.admin_thread,
                    f"model-unreachable:{oldest}",
                    f"The router's model has been unreachable for {waited:.0f}s "
                    f"({failures.describe(cause)}); events wait in the inbox and the "
                    "threads waiting for an answer were told their messages are queued.",
                )
        self._unreachable_alerted = True

    def _reachable(self) -> None:
        """The model answered: the unreachable clock starts again at the next outage."""
        if self._unreachable_since is not None:
            log.warning(
                "router: the model answers again after %.0fs",
                time.monotonic() - self._unreachable_since,
            )
        self._unreachable_since = None
        self._unreachable_alerted = False

    async def _listen(self) -> asyncpg.Connection | None:
        try:
            conn = await asyncpg.connect(self.dsn)
            await conn.add_listener(ROUTER_CHANNEL, lambda *_: self._wake.set())
        except (OSError, asyncpg.PostgresError) as exc:
            if not await outage.absorbed(exc, "router"):
                log.warning("router: no LISTEN connection (%s); polling", exc)
            return None
        return conn


def model_unreachable(exc: BaseException) -> bool:
    """The model cannot be reached or used at all: the deployment's failure, not a batch's
    (an outage after the client's own retries, a bad key, no access, an unknown model)."""
    if isinstance(exc, Transient):
        return True
    if isinstance(exc, Permanent):
        return exc.status in UNREACHABLE_STATUSES
    return isinstance(exc, openai.OpenAIError)  # raw: the boundary would have classified it


_DATABASE_TROUBLE = (
    asyncpg.exceptions.TransactionRollbackError,  # serialization failure, deadlock
    asyncpg.exceptions.InsufficientResourcesError,  # disk full, too many connections
    asyncpg.exceptions.OperatorInterventionError,  # shutdown, cancelled by an admin
    asyncpg.exceptions.LockNotAvailableError,
)


def infrastructure(exc: BaseException) -> bool:
    """The database's trouble, not the batch's: an outage, a deadlock, a full disk."""
    return outage.is_connection_error(exc) or isinstance(exc, _DATABASE_TROUBLE)


def _item_id(trigger_ids: Sequence[str]) -> str:
    """The failed item, for ``item_failures.item_id`` (at most 500 characters)."""
    text = ",".join(trigger_ids)
    if len(text) <= 500:
        return text
    shown: list[str] = []
    for trigger_id in trigger_ids:
        if len(",".join([*shown, trigger_id])) > 470:
            break
        shown.append(trigger_id)
    return ",".join(shown) + f",…(+{len(trigger_ids) - len(shown)})"
