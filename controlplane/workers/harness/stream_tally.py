"""A running summary of one harness run, kept by its round as events arrive.

:class:`Tally` answers what the round asks after (or during) a run: which session to
resume, how many turns and tokens it took, which files it changed, what it said last,
whether it succeeded, and the signature of each tool call for loop detection.

Usage is never counted twice: a ``result`` carries the harness's own totals for the run
and replaces the sum of the per-call ``usage`` events; the sum stands only when the
stream ended without one (killed, cut, capped). Files come from successful tool results
(a failed write changed nothing).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from controlplane.workers.harness.stream_events import HarnessEvent, Usage

__all__ = ["SIGNATURE_CHARS", "Tally", "signature"]

SIGNATURE_CHARS = 1000  # longer canonical arguments are hashed, to keep signatures small


def signature(event: HarnessEvent) -> str:
    """A tool call's identity for loop detection: ``name:canonical JSON of its arguments``
    (the JSON hashed when long). Equal for identical calls, different otherwise."""
    canonical = json.dumps(
        event.arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    )
    if len(canonical) > SIGNATURE_CHARS:
        digest = hashlib.sha256(canonical.encode("utf-8", errors="replace")).hexdigest()
        canonical = f"sha256:{digest}"
    return f"{event.tool or '?'}:{canonical}"


@dataclass
class Tally:
    """Running summary of one run's events (see the module docstring)."""

    session_id: str | None = None
    model: str | None = None  # the model the harness said it runs, if it said
    turns: int = 0  # model turns (claude/qwen: model calls; codex: turns)
    usage: Usage = field(default_factory=Usage)
    files: list[str] = field(default_factory=list)  # changed, in order, deduped
    last_message: str = ""  # the last assistant text of the main agent
    result_text: str | None = None
    succeeded: bool | None = None  # None: the stream ended without a result
    error: str | None = None
    tool_signatures: list[str] = field(default_factory=list)
    _call_usage: Usage = field(default_factory=Usage, repr=False)
    _result_usage: Usage | None = field(default=None, repr=False)

    def add(self, event: HarnessEvent) -> None:
        if event.session_id:
            self.session_id = event.session_id
        if event.model:
            self.model = event.model
        if event.kind == "message" and event.parent_call_id is None:
            self.last_message = event.text
        elif event.kind == "tool_call":
            self.tool_signatures.append(signature(event))
        elif event.kind == "tool_result" and not event.is_error:
            for path in event.files:
                if path not in self.files:
                    self.files.append(path)
        elif event.kind == "usage" and event.usage is not None:
            self._call_usage = self._call_usage + event.usage
            if event.parent_call_id is None:
                self.turns += 1
        elif event.kind == "result":
            self.succeeded = not event.is_error
            self.result_text = event.text
            if event.is_error:
                self.error = event.text or "failed"
            if event.usage is not None:
                self._result_usage = event.usage
            if event.turns is not None:
                self.turns = event.turns
        elif event.kind == "error":
            self.error = event.text or "error"
        self.usage = self._result_usage if self._result_usage is not None else self._call_usage

    def extend(self, events: list[HarnessEvent]) -> None:
        for event in events:
            self.add(event)

    def repeated_call(self) -> tuple[str, int] | None:
        """The last tool call's signature and how many times in a row it was made."""
        if not self.tool_signatures:
            return None
        last = self.tool_signatures[-1]
        count = 0
        for sig in reversed(self.tool_signatures):
            if sig != last:
                break
            count += 1
        return last, count
