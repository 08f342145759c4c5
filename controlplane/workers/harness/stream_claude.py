"""Claude Code's and Qwen Code's ``stream-json`` output, parsed into harness events.

Qwen Code copied Claude Code's stream format, so one parser reads both
(``claude -p --output-format stream-json --verbose``;
``qwen --output-format stream-json``). Each line is one message:

* ``{"type": "system", "subtype": "init", "session_id", "tools", "model", ...}`` opens the run;
* ``{"type": "assistant", "message": {"id", "content": [text | tool_use | thinking ...],
  "usage"}, "session_id", "parent_tool_use_id"}``: what the model said and called;
* ``{"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id",
  "content", "is_error"}]}}``: each call's result, as the model will read it;
* ``{"type": "result", "subtype": "success" | "error_max_turns" | "error_during_execution"
  ..., "is_error", "result", "num_turns", "usage", "total_cost_usd" (claude),
  "errors" (claude) | "error": {"message"} (qwen)}`` closes it.

Sources: Claude Code's headless and CLI references (docs.anthropic.com/en/docs/claude-code/
cli-reference, .../sdk/sdk-headless); a real qwen 0.24.4 run recorded in
``tests/controlplane/workers/harness/samples/qwen.jsonl``.

Two quirks shape this module:

* Claude Code prints one ``assistant`` line per content block of a model response, each
  with the same ``message.id`` and that response's usage repeated (the last is the final
  count). Usage is therefore held per response and emitted once, as one ``usage`` event,
  when the next response (in the same agent: sub-agents interleave) or the result
  arrives. Qwen gives each block its own id, the first often with zero usage; zero usage
  is not emitted.
* Claude's ``input_tokens`` excludes cache reads and cache writes (Anthropic's
  accounting); qwen's includes cache reads (OpenAI's, as the sample shows). Both become
  :class:`Usage` with ``prompt_tokens`` including everything read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from controlplane.workers.harness.stream_events import (
    NOTE_CHARS,
    TEXT_CHARS,
    HarnessEvent,
    Usage,
    as_int,
    as_text,
    cap,
    cap_arguments,
)
from controlplane.workers.harness.stream_lines import JsonLinesParser

__all__ = ["CLAUDE_WRITERS", "QWEN_WRITERS", "ClaudeStreamParser"]

# Tools that write files, and the argument naming the file.
CLAUDE_WRITERS = {
    "Write": "file_path",
    "Edit": "file_path",
    "MultiEdit": "file_path",
    "NotebookEdit": "notebook_path",
}
QWEN_WRITERS = {"write_file": "file_path", "edit": "file_path", "notebook_edit": "notebook_path"}

# Types that carry nothing the round records (partial deltas, qwen's goal state...).
_QUIET = {"stream_event", "control_request", "control_response", "keep_alive", "rate_limit_event"}


@dataclass
class _Pending:
    message_id: str
    usage: Usage
    session_id: str | None
    parent: str | None


class ClaudeStreamParser(JsonLinesParser):
    """Claude Code (``harness="claude"``) or Qwen Code (``harness="qwen"``) stream-json."""

    def __init__(self, harness: str = "claude", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if harness not in ("claude", "qwen"):
            raise ValueError(f"not a claude-family harness: {harness!r}")
        self.harness = harness
        self._cache_in_input = harness == "qwen"
        self._writers = QWEN_WRITERS if harness == "qwen" else {**QWEN_WRITERS, **CLAUDE_WRITERS}
        self._session: str | None = None
        self._pending: dict[str | None, _Pending] = {}  # by agent: None is the main one
        self._call_files: dict[str, tuple[str, ...]] = {}
        self._call_tools: dict[str, str] = {}
        self._unknown: set[str] = set()

    def decode(self, obj: dict[str, Any]) -> list[HarnessEvent]:
        kind = obj.get("type")
        # The run's model, said once at its start: what its tokens cost when the harness
        # reports no cost of its own (Qwen Code).
        model = obj.get("model") if kind == "system" and obj.get("subtype") == "init" else None
        events = self._session_events(obj.get("session_id"), model)
        if kind == "assistant":
            events += self._assistant(obj)
        elif kind == "user":
            events += self._user(obj)
        elif kind == "result":
            events += self.flush()
            events.append(self._result(obj))
        elif kind == "system" or kind in _QUIET:
            pass  # init's session id is taken above; other subtypes are status
        elif isinstance(kind, str) and kind not in self._unknown and len(self._unknown) < 50:
            self._unknown.add(kind)  # a newer version's event: say so once, then skip it
            events.append(self._note(f"{self.harness}: skipped event type {kind!r}"))
        return events

    def flush(self) -> list[HarnessEvent]:
        events = [e for p in self._pending.values() for e in self._usage_event(p)]
        self._pending.clear()
        return events

    # ------------------------------------------------------------------ messages

    def _session_events(self, session_id: Any, model: Any = None) -> list[HarnessEvent]:
        if not isinstance(session_id, str) or not session_id or session_id == self._session:
            return []
        self._session = cap(session_id, NOTE_CHARS)
        named = cap(model, NOTE_CHARS) if isinstance(model, str) and model else None
        return [HarnessEvent("session", session_id=self._session, model=named)]

    def _assistant(self, obj: Mapping[str, Any]) -> list[HarnessEvent]:
        message = _mapping(obj.get("message"))
        parent = _str_or_none(obj.get("parent_tool_use_id"))
        events: list[HarnessEvent] = []
        message_id = _str_or_none(message.get("id"))
        usage = self._usage(_mapping(message.get("usage")))
        if message_id is not None:
            pending = self._pending.get(parent)
            if pending is not None and pending.message_id != message_id:
                events += self._usage_event(pending)
            self._pending[parent] = _Pending(message_id, usage, self._session, parent)
        else:
            events += self._usage_event(_Pending("", usage, self._session, parent))
        content = message.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        for block in blocks:
            if isinstance(block, Mapping):
                events.extend(self._assistant_block(block, parent))
        error = obj.get("error")
        if isinstance(error, str) and error:
            text = cap(error, NOTE_CHARS)
            events.append(HarnessEvent("error", text=text, session_id=self._session))
        return events

    def _assistant_block(self, block: Mapping[str, Any], parent: str | None) -> list[HarnessEvent]:
        kind = block.get("type")
        if kind == "text":
            text = as_text(block.get("text"))
            if not text:
                return []
            return [
                HarnessEvent("message", text=text, session_id=self._session, parent_call_id=parent)
            ]
        if kind == "tool_use":
            tool = as_text(block.get("name"), NOTE_CHARS) or "unknown"
            call_id = _str_or_none(block.get("id"))
            arguments = cap_arguments(block.get("input"))
            files = self._files(tool, arguments)
            if call_id is not None:
                self._call_files[call_id] = files
                self._call_tools[call_id] = tool
            return [
                HarnessEvent(
                    "tool_call",
                    session_id=self._session,
                    tool=tool,
                    call_id=call_id,
                    arguments=arguments,
                    files=files,
                    parent_call_id=parent,
                )
            ]
        return []  # thinking, server-side tool blocks, newer block types

    def _user(self, obj: Mapping[str, Any]) -> list[HarnessEvent]:
        content = _mapping(obj.get("message")).get("content")
        if not isinstance(content, list):
            return []  # the prompt echoed back
        parent = _str_or_none(obj.get("parent_tool_use_id"))
        # Results follow the whole response that made the calls: its usage is final.
        pending = self._pending.pop(parent, None)
        events = self._usage_event(pending) if pending is not None else []
        for block in content:
            if not isinstance(block, Mapping) or block.get("type") != "tool_result":
                continue
            call_id = _str_or_none(block.get("tool_use_id"))
            events.append(
                HarnessEvent(
                    "tool_result",
                    text=_result_text(block.get("content")),
                    session_id=self._session,
                    tool=self._call_tools.pop(call_id, None) if call_id else None,
                    call_id=call_id,
                    files=self._call_files.pop(call_id, ()) if call_id else (),
                    is_error=block.get("is_error") is True,
                    parent_call_id=parent,
                )
            )
        return events

    def _result(self, obj: Mapping[str, Any]) -> HarnessEvent:
        subtype = obj.get("subtype")
        is_error = obj.get("is_error") is True or (
            isinstance(subtype, str) and subtype != "success"
        )
        text = as_text(obj.get("result"))
        if is_error and not text:
            text = _error_text(obj) or as_text(obj.get("subtype"), NOTE_CHARS) or "failed"
        # Without totals the per-call usage stands (Tally sums it), so none is made up here.
        usage = None
        if isinstance(obj.get("usage"), Mapping):
            usage = self._usage(obj["usage"])
        cost = obj.get("total_cost_usd")
        if isinstance(cost, int | float) and not isinstance(cost, bool) and cost >= 0:
            usage = replace(usage or Usage(), cost_usd=float(cost))
        turns = obj.get("num_turns")
        return HarnessEvent(
            "result",
            text=text,
            session_id=self._session,
            is_error=is_error,
            usage=usage,
            turns=as_int(turns) if isinstance(turns, int | float) else None,
        )

    # ------------------------------------------------------------------ helpers

    def _usage(self, usage: Mapping[str, Any]) -> Usage:
        read = as_int(usage.get("cache_read_input_tokens"))
        prompt = as_int(usage.get("input_tokens"))
        if not self._cache_in_input:
            prompt += read + as_int(usage.get("cache_creation_input_tokens"))
        return Usage(prompt, as_int(usage.get("output_tokens")), read)

    def _usage_event(self, pending: _Pending) -> list[HarnessEvent]:
        if pending.usage.empty:
            return []  # qwen's text-only part of a response: its usage comes with the rest
        event = HarnessEvent(
            "usage",
            session_id=pending.session_id,
            usage=pending.usage,
            parent_call_id=pending.parent,
        )
        return [event]

    def _files(self, tool: str, arguments: Mapping[str, Any]) -> tuple[str, ...]:
        key = self._writers.get(tool)
        path = arguments.get(key) if key else None
        return (path,) if isinstance(path, str) and path else ()


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _str_or_none(value: Any) -> str | None:
    return cap(value, NOTE_CHARS) if isinstance(value, str) and value else None


def _result_text(content: Any) -> str:
    """A tool result's text: a string, or the text blocks of a list (images are named)."""
    if isinstance(content, str):
        return cap(content)
    if not isinstance(content, list):
        return ""
    parts: list[str] = []
    size = 0
    for block in content:
        if isinstance(block, Mapping) and isinstance(block.get("text"), str):
            part = block["text"]
        elif isinstance(block, Mapping) and isinstance(block.get("type"), str):
            part = f"[{block['type']}]"
        else:
            continue
        parts.append(part)
        size += len(part)
        if size > TEXT_CHARS:
            break
    return cap("\n".join(parts))


def _error_text(obj: Mapping[str, Any]) -> str:
    error = obj.get("error")  # qwen: {"message": ...}
    if isinstance(error, Mapping):
        return as_text(error.get("message"))
    if isinstance(error, str):
        return cap(error)
    errors = obj.get("errors")  # claude: ["...", ...]
    if isinstance(errors, list):
        return cap("; ".join(e for e in errors[:20] if isinstance(e, str)))
    return ""
