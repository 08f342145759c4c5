"""The router's bounded context: the system prompt, a summary of older turns, the last turns.

Compaction happens in steps of several turns (``COMPACT_AT`` held, ``KEEP_TURNS`` kept),
so the prefix (prompt, tools, summary) stays byte-identical across most calls and
providers' prefix caches hit. Besides the turn count, the size is bounded: before each
model call the prompt's tokens are estimated (:mod:`controlplane.llm.tokens`) and, past
the budget (``llm.router_context_tokens * llm.compact_share``), compacted in steps: old
tool outputs are cut to their head and tail (with the IDs they named, for recall), then
older turns go into the summary (the last ones stay verbatim), then all of them. The
summary itself is bounded in lines and characters.

Compaction is described by two turn numbers that only ever rise, persisted with each turn
(:class:`TurnRecord`), so replaying the same turns rebuilds the same context.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from controlplane.llm.tokens import CHARS_PER_TOKEN, estimate_tokens

KEEP_TURNS = 6  # turns kept in full; older ones are compacted
COMPACT_AT = 10  # compaction happens once this many turns are held
CLIP_HEAD = CLIP_TAIL = 500  # characters of a compacted tool output kept at each end
CLIP_OVER = CLIP_HEAD + CLIP_TAIL + 600  # tool outputs up to this long stay whole
CLIP_IDS = 20  # IDs named in a cut tool output, kept for recall
VERBATIM_TURNS = 2  # turns a size compaction keeps in full
SUMMARY_LINES = 200
SUMMARY_CHARS = 8000  # at most; a quarter of the budget when that is less
LINE_CHARS = 300  # characters of one summary line
_IDS = re.compile(r"\b(?:trg|tkt|thr|blb|cmd)_[0-9a-z]{12}\b")


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
class TurnRecord:
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
    turns: list[TurnRecord] = field(default_factory=list)
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

    def add(self, record: TurnRecord) -> None:
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

    def _summarize(self, old: list[TurnRecord]) -> None:
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
