"""Bounded context for a worker: before a model call would fill more than
``llm.compact_share`` of ``llm.worker_context_tokens``, its session is compacted.

The estimate is the length of the JSON the call sends (the tool specs, then each message)
divided by four, scaled by what the provider counted for the last call of known length
(its ``usage.prompt_tokens``; never below the plain estimate). It costs no tokenizer and
follows the session through compactions, which the last call's count alone would not.

Compaction goes in steps, and stops at the first that fits:

1. Old tool outputs are reduced to their first and last 1,000 characters and how to read
   the rest (``recall(id=msg_...)``): first those older than the last three turns, then
   all but the last turn's.
2. Older turns are summarised into a "progress so far" note by the model (one call with no
   tools, accounted to the session and ticket); if that call fails, the note is made by
   hand: each tool call and the first line of its result. Enough old turns are folded in
   that the context comes back to 60 % of the threshold, so the next compaction is some
   calls away and the prefix stays cached meanwhile.
3. Last, the newest tool outputs are reduced too (one output larger than the window).

The system prompt, the tool specs and the brief (with the mandate) are never touched, so
the prefix stays byte-identical across calls, compactions included; turns are cut only
before an assistant message or an event, never between calls and their results. A forced
compaction (the provider answered ``context_length_exceeded``) aims at half of what the
refused call held.

Each compaction is a row of the session (:meth:`WorkerSession.compact`) and one log line.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import asyncpg

from controlplane.llm import Accounting, LlmClient, LlmError
from controlplane.llm.tokens import CHARS_PER_TOKEN, prompt_chars
from controlplane.settings import LlmSettings
from controlplane.workers.session import Compaction, WorkerSession, reduced

log = logging.getLogger(__name__)

KEEP_TURNS = 3  # turns whose tool outputs stay whole in the first step
AIM = 0.6  # a summary folds old turns until the context is this share of the threshold
SUMMARY_CHARS = 6000  # the longest progress note (or a tenth of a small window)
ENTRY_CHARS = 1500  # of each message, in what the summariser reads
LINE_CHARS = 160  # of each call and result line, in a summary made by hand

SUMMARY_PROMPT = (
    "You compact the working session of a coding agent so that it can go on within its "
    "context window. Fold the turns you are given into the progress note so far, and "
    "answer with the new note alone, in at most {chars} characters of plain text: what "
    "has been done and found (files, commands, results, errors, the ids of outputs, "
    "such as cmd_ and msg_, that can be read again), what was decided and why, and what "
    "remains to do. Keep facts exact; do not invent any. The agent keeps the ticket's "
    "brief and its latest turns in full: do not repeat them."
)


@dataclass
class Budget:
    """The window, the threshold, and the estimate of a prompt's tokens."""

    window: int
    share: float
    ratio: float = 1.0  # the provider's tokens per chars/4 estimate, as last observed

    @property
    def limit(self) -> int:
        return int(self.window * self.share)

    def tokens(self, chars: int) -> int:
        return math.ceil(chars / CHARS_PER_TOKEN * self.ratio)

    def learn(self, chars: int, prompt_tokens: int) -> None:
        """A call of ``chars`` was counted ``prompt_tokens`` by the provider."""
        if chars > 0 and prompt_tokens > 0:
            self.ratio = max(1.0, prompt_tokens * CHARS_PER_TOKEN / chars)


@dataclass(frozen=True)
class Compacted:
    state: Compaction
    before: int  # estimated tokens of the call, before
    after: int
    steps: tuple[str, ...]  # reduced, summarised, summarised by hand, reduced newest


class Compactor:
    """Decides when a worker's context is compacted, and how."""

    def __init__(self, llm: LlmClient, model: str, settings: LlmSettings) -> None:
        self.llm = llm
        self.model = model
        self.budget = Budget(settings.worker_context_tokens, settings.compact_share)
        self.summary_chars = min(SUMMARY_CHARS, settings.worker_context_tokens * 4 // 10)

    def fit(self, window: int) -> None:
        """Work within ``window`` tokens (the model's, as found: LlmClient.context_tokens)."""
        self.budget.window = window
        self.summary_chars = min(SUMMARY_CHARS, window * 4 // 10)

    def tokens(
        self,
        session: WorkerSession,
        system: Mapping[str, Any],
        tools: Sequence[Any],
        state: Compaction | None = None,
    ) -> int:
        return self.budget.tokens(prompt_chars([system, *session.context(state)], tools))

    async def compact(
        self,
        pool: asyncpg.Pool,
        session: WorkerSession,
        *,
        system: Mapping[str, Any],
        tools: Sequence[Any],
        accounting: Accounting,
        ticket_id: str,
        force: bool = False,
    ) -> Compacted | None:
        """Compact the session if the next call would not fit (``force``: the provider
        said it does not); records and returns what was done, or None if nothing was."""
        current = session.compaction
        before = self.tokens(session, system, tools)
        limit = self.budget.limit
        if force:
            limit = min(limit, before // 2)
        elif before <= limit:
            return None
        steps: list[str] = []

        def fits(candidate: Compaction) -> bool:
            return self.tokens(session, system, tools, candidate) <= limit

        state = current
        turns = session.blocks(state)
        for keep in (KEEP_TURNS, 1):
            if len(turns) > keep:
                cut = turns[-keep]  # the first message kept whole
                state = replace(state, reduced_upto=max(state.reduced_upto, session.seqs[cut - 1]))
                if fits(state):
                    break
        if session.context(state) != session.context(current):
            steps.append("reduced")
        if not fits(state) and len(turns) > 1:
            state, how = await self._summarise(
                session, state, turns, int(limit * AIM), system, tools, accounting
            )
            steps.append(how)
        if not fits(state) and session.messages:
            newest = replace(state, reduced_upto=session.seqs[-1])
            if session.context(newest) != session.context(state):
                state = newest
                steps.append("reduced newest")
        if session.context(state) == session.context(current):
            return None
        after = self.tokens(session, system, tools, state)
        done = Compacted(state, before, after, tuple(steps))
        await session.compact(
            pool,
            state,
            forced=force,
            steps=list(done.steps),
            tokens_before=before,
            tokens_after=after,
        )
        log.info(
            "worker %s: context compacted%s from ~%d to ~%d tokens (%s; window %d)",
            ticket_id,
            " (forced)" if force else "",
            before,
            after,
            ", ".join(steps),
            self.budget.window,
        )
        return done

    async def _summarise(
        self,
        session: WorkerSession,
        state: Compaction,
        turns: list[int],
        aim: int,
        system: Mapping[str, Any],
        tools: Sequence[Any],
        accounting: Accounting,
    ) -> tuple[Compaction, str]:
        """Fold the oldest turns into the progress note, enough of them to come under
        ``aim`` tokens (the newest turn always stays); returns the state and how."""
        placeholder = "x" * self.summary_chars

        def folded_to(keep_from: int) -> Compaction:
            return replace(state, upto_seq=session.seqs[keep_from - 1], summary=placeholder)

        # The fewest turns folded that come under the aim (the size falls as more are).
        low, high = 1, len(turns) - 1
        while low < high:
            middle = (low + high) // 2
            if self.tokens(session, system, tools, folded_to(turns[middle])) <= aim:
                high = middle
            else:
                low = middle + 1
        keep_from = turns[low]
        entries = _entries(session, state, turns[0], keep_from)
        summary = await self._ask(session, state.summary, entries, accounting)
        how = "summarised"
        if not summary:
            summary = _by_hand(state.summary, session, state, turns[0], keep_from)
            how = "summarised by hand"
        summary = _bounded(summary, self.summary_chars)
        return (
            replace(state, upto_seq=session.seqs[keep_from - 1], summary=summary),
            how,
        )

    async def _ask(
        self,
        session: WorkerSession,
        previous: str,
        entries: list[str],
        accounting: Accounting,
    ) -> str | None:
        """The model's progress note, or None if the call fails."""
        brief = str(session.messages[session.head - 1].get("content") or "") if session.head else ""
        room = int(self.budget.limit * CHARS_PER_TOKEN / self.budget.ratio * 0.8)
        room -= len(SUMMARY_PROMPT) + len(brief) + len(previous) + self.summary_chars
        text = "\n".join(_fitted(entries, max(room, 4000)))
        try:
            answer = await self.llm.complete(
                model=self.model,
                max_tokens=self.llm.settings.summary_max_tokens,
                messages=[
                    {"role": "system", "content": SUMMARY_PROMPT.format(chars=self.summary_chars)},
                    {
                        "role": "user",
                        "content": f"The ticket's brief:\n{brief}\n\n"
                        f"The progress note so far:\n{previous or '(none yet)'}\n\n"
                        f"The turns to fold in, oldest first:\n{text}",
                    },
                ],
                accounting=replace(accounting, prompt_version_id=None),  # not the worker prompt
            )
        except LlmError as exc:
            log.warning("worker session %s: the summary call failed (%s)", session.id, exc)
            return None
        return (answer.content or "").strip() or None


def _shown(session: WorkerSession, state: Compaction, index: int) -> dict[str, Any]:
    message = session.messages[index]
    if message.get("role") == "tool" and session.seqs[index] <= state.reduced_upto:
        return reduced(message, session.ids[index])
    return message


def _names(session: WorkerSession, start: int, end: int) -> dict[str, str]:
    """The tool name of each call made in messages ``start`` to ``end``."""
    return {
        call.get("id", ""): call.get("function", {}).get("name", "?")
        for message in session.messages[start:end]
        for call in message.get("tool_calls") or []
    }


def _entries(session: WorkerSession, state: Compaction, start: int, end: int) -> list[str]:
    """What the summariser reads of messages ``start`` to ``end``: one entry each."""
    names = _names(session, start, end)
    out = []
    for index in range(start, end):
        message = _shown(session, state, index)
        text = str(message.get("content") or "")
        role = message.get("role")
        if role == "assistant":
            calls = "".join(
                f"\n  calls {call.get('function', {}).get('name')}"
                f"({str(call.get('function', {}).get('arguments'))[:300]})"
                for call in message.get("tool_calls") or []
            )
            out.append(f"[assistant] {text[:ENTRY_CHARS]}{calls}")
        elif role == "tool":
            name = names.get(str(message.get("tool_call_id")), "?")
            out.append(f"[{name} result, {session.ids[index]}] {text[:ENTRY_CHARS]}")
        else:
            out.append(f"[{role}] {text[:ENTRY_CHARS]}")
    return out


def _fitted(entries: list[str], room: int) -> list[str]:
    """Entries within ``room`` characters: the first and the last, the middle left out."""
    if sum(len(e) + 1 for e in entries) <= room:
        return entries
    head: list[str] = []
    tail: list[str] = []
    used = 0
    low, high = 0, len(entries) - 1
    while low <= high:
        pick_tail = len(tail) <= len(head)
        entry = entries[high] if pick_tail else entries[low]
        if used + len(entry) + 1 > room:
            break
        used += len(entry) + 1
        if pick_tail:
            tail.insert(0, entry)
            high -= 1
        else:
            head.append(entry)
            low += 1
    return [*head, f"[... {high - low + 1} entries left out ...]", *tail]


def _first_line(content: Any) -> str:
    """A tool result's gist: its error or output's first line, else its start."""
    text = str(content or "")
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        for key in ("error", "output", "output_head", "head", "note"):
            value = parsed.get(key)
            if isinstance(value, str) and value.strip():
                return f"{key}: {value.strip().splitlines()[0]}"[:LINE_CHARS]
    return text.strip().splitlines()[0][:LINE_CHARS] if text.strip() else "(empty)"


def _by_hand(previous: str, session: WorkerSession, state: Compaction, start: int, end: int) -> str:
    """A progress note without the model: each call made, and its result's first line."""
    results = {
        str(message.get("tool_call_id")): (index, message)
        for index, message in enumerate(session.messages[start:end], start)
        if message.get("role") == "tool"
    }
    lines = [previous] if previous else []
    for message in session.messages[start:end]:
        role = message.get("role")
        text = str(message.get("content") or "").strip()
        if role == "assistant":
            if text:
                lines.append(f"- said: {text.splitlines()[0][:LINE_CHARS]}")
            for call in message.get("tool_calls") or []:
                function = call.get("function", {})
                found = results.get(str(call.get("id")))
                gist = "(no result)" if found is None else _first_line(found[1].get("content"))
                where = f" [{session.ids[found[0]]}]" if found is not None else ""
                lines.append(
                    f"- {function.get('name')}({str(function.get('arguments'))[:LINE_CHARS]})"
                    f" -> {gist}{where}"
                )
        elif role == "user" and text:
            lines.append(f"- told: {text.splitlines()[0][:LINE_CHARS]}")
    return "\n".join(lines)


def _bounded(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters: its start and (mostly) its end."""
    if len(text) <= limit:
        return text
    note = f"\n[... {len(text) - limit:,} characters of older progress left out ...]\n"
    room = max(0, limit - len(note))
    head = room * 3 // 10
    return text[:head] + note + text[len(text) - (room - head) :]
