"""Parsing coding-agent CLIs' ("harnesses'") output streams into one event model.

A worker can run a harness (Claude Code, Codex CLI, Qwen Code) on a developer's device in a
ticket's workspace; its stdout comes back as a job's output bytes. :func:`parser_for`
gives the parser for a harness: ``feed`` it the bytes as they arrive, ``finish`` it at the
end, and record the :class:`HarnessEvent` values it returns; a :class:`Tally` keeps the
run's summary (session to resume, turns, usage, files, outcome, loop signatures).

This package only reads: it runs nothing, touches no database, and trusts nothing in the
stream. The bytes come from a model-driven process on a device, so every text is capped,
every field is checked, and no input makes a parser raise. Formats:
:mod:`.stream_claude` (claude, qwen), :mod:`.stream_codex` (codex), with sources there.
"""

from __future__ import annotations

from typing import Protocol

from controlplane.workers.harness.stream_claude import ClaudeStreamParser
from controlplane.workers.harness.stream_codex import CodexStreamParser
from controlplane.workers.harness.stream_events import EventKind, HarnessEvent, Usage
from controlplane.workers.harness.stream_lines import MAX_LINE_BYTES
from controlplane.workers.harness.stream_tally import Tally, signature

__all__ = [
    "HARNESSES",
    "MAX_LINE_BYTES",
    "EventKind",
    "HarnessEvent",
    "StreamParser",
    "Tally",
    "Usage",
    "parser_for",
    "signature",
]

HARNESSES = ("claude", "codex", "qwen")


class StreamParser(Protocol):
    """Incremental: ``feed`` any chunking of the output, ``finish`` once at its end."""

    def feed(self, data: bytes) -> list[HarnessEvent]: ...

    def finish(self) -> list[HarnessEvent]: ...


def parser_for(harness: str, *, max_line_bytes: int = MAX_LINE_BYTES) -> StreamParser:
    """A new parser for ``harness`` (one of :data:`HARNESSES`); ``ValueError`` otherwise."""
    if harness == "codex":
        return CodexStreamParser(max_line_bytes=max_line_bytes)
    if harness in ("claude", "qwen"):
        return ClaudeStreamParser(harness, max_line_bytes=max_line_bytes)
    raise ValueError(f"unknown harness {harness!r}: expected one of {', '.join(HARNESSES)}")
