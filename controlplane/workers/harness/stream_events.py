"""The common event model every harness's output stream is parsed into, and its caps.

Harness CLIs print what they do as JSON lines in their own shapes; the parsers
(:mod:`.stream_claude`, :mod:`.stream_codex`) turn them into :class:`HarnessEvent` values so
the round records messages, tool calls and usage, detects loops and finds the session
to resume without knowing which harness ran. Everything here is text from a process we do
not control: each string is capped (:func:`cap`, :func:`cap_arguments`) before it becomes
an event, so a harness printing megabytes costs us kilobytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "ARG_ITEMS",
    "ARG_STRING_CHARS",
    "DEPTH",
    "NOTE_CHARS",
    "TEXT_CHARS",
    "EventKind",
    "HarnessEvent",
    "Usage",
    "as_int",
    "as_text",
    "cap",
    "cap_arguments",
]

TEXT_CHARS = 16_000  # a message, a tool result, a result text
NOTE_CHARS = 500  # a stray line, an error about the stream itself
ARG_STRING_CHARS = 4_000  # each string inside a tool call's arguments
ARG_ITEMS = 200  # items of each list or object inside arguments
DEPTH = 8  # nesting kept inside arguments

EventKind = Literal[
    "session", "message", "tool_call", "tool_result", "usage", "result", "error", "note"
]


@dataclass(frozen=True)
class Usage:
    """Tokens a harness reports. ``prompt_tokens`` includes ``cached_tokens`` (as in
    OpenAI's accounting), whatever the harness's own convention, so totals compare."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float | None = None  # when the harness reports it

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        cost = None
        if self.cost_usd is not None or other.cost_usd is not None:
            cost = (self.cost_usd or 0.0) + (other.cost_usd or 0.0)
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cached_tokens + other.cached_tokens,
            cost,
        )

    @property
    def empty(self) -> bool:
        return self.total == 0 and self.cached_tokens == 0 and self.cost_usd is None


@dataclass(frozen=True)
class HarnessEvent:
    """One thing a harness did, in a shape common to all harnesses.

    ``kind`` says which fields matter: ``session`` (``session_id``), ``message`` (``text``:
    the model's words), ``tool_call`` (``tool``, ``call_id``, ``arguments``, ``files``),
    ``tool_result`` (``tool``, ``call_id``, ``text``, ``is_error``, and the call's
    ``files``), ``usage`` (one model call's ``usage``), ``result`` (the run's end:
    ``text``, ``is_error``, total ``usage``, ``turns``), ``error`` (the harness reported a
    failure, which may not end the run), ``note`` (anything else in the output: a stray
    stderr line, garbage, an event type this version does not know).
    """

    kind: EventKind
    text: str = ""  # message text, tool result text (capped), error/notes
    session_id: str | None = None  # on "session" (and wherever the stream carries it)
    model: str | None = None  # on "session", when the harness names the model it runs
    tool: str | None = None  # the harness's tool name (codex: "command_execution", ...)
    call_id: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)  # tool_call input (capped)
    files: tuple[str, ...] = ()  # paths a tool call writes or changed, where the stream says
    is_error: bool = False
    usage: Usage | None = None  # on "usage" (per model call) and "result" (totals)
    turns: int | None = None  # on "result": the harness's own count of model turns
    parent_call_id: str | None = None  # set on what a sub-agent (claude's Task) did


def cap(text: str, limit: int = TEXT_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit} more characters]"


def as_text(value: Any, limit: int = TEXT_CHARS) -> str:
    """A string field of an event as capped text; a missing or odd field is ``""``."""
    return cap(value, limit) if isinstance(value, str) else ""


def as_int(value: Any) -> int:
    """A token count: a non-negative integer, or 0 for anything else."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, float) and math.isfinite(value):
        return max(int(value), 0)
    return 0


def cap_arguments(value: Any) -> dict[str, Any]:
    """A tool call's arguments, as a dict of capped JSON values (not a dict: ``{}``)."""
    if not isinstance(value, Mapping):
        return {}
    capped = _cap_value(value, DEPTH)
    return capped if isinstance(capped, dict) else {}


def _cap_value(value: Any, depth: int) -> Any:
    if isinstance(value, str):
        return cap(value, ARG_STRING_CHARS)
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if depth <= 0:
        return "…"
    if isinstance(value, Mapping):
        items = list(value.items())
        out = {str(k)[:ARG_STRING_CHARS]: _cap_value(v, depth - 1) for k, v in items[:ARG_ITEMS]}
        if len(items) > ARG_ITEMS:
            out["…"] = f"{len(items) - ARG_ITEMS} more keys"
        return out
    if isinstance(value, list | tuple):
        kept = [_cap_value(v, depth - 1) for v in value[:ARG_ITEMS]]
        if len(value) > ARG_ITEMS:
            kept.append(f"… {len(value) - ARG_ITEMS} more items")
        return kept
    return cap(str(value), ARG_STRING_CHARS)
