"""Codex CLI's ``codex exec --json`` output, parsed into harness events.

Each line is a ``ThreadEvent`` (``codex-rs/exec/src/exec_events.rs`` in openai/codex;
described in its ``docs/exec.md``, "JSON output mode"):

* ``thread.started`` ``{thread_id}``: the id ``codex exec resume <id>`` takes;
* ``turn.started``; ``turn.completed`` ``{usage: {input_tokens, cached_input_tokens,
  output_tokens}}``; ``turn.failed`` ``{error: {message}}``;
* ``item.started`` / ``item.updated`` / ``item.completed`` ``{item: {id, type, ...}}`` with
  ``type`` one of ``agent_message`` {text}, ``reasoning`` {text}, ``command_execution``
  {command, aggregated_output, exit_code, status}, ``file_change`` {changes: [{path, kind}],
  status}, ``mcp_tool_call`` {server, tool, arguments, result, error, status},
  ``web_search`` {query}, ``todo_list`` {items}, ``error`` {message} (a warning: the run
  goes on), and in newer versions ``collab_tool_call`` and ``plan``;
* ``error`` ``{message}``: a stream error (codex may retry after it).

``turn.completed``'s usage is the thread's running total, not the turn's
(``event_processor_with_jsonl_output.rs`` reports ``usage.total``), so it becomes the
``result`` event's usage and no per-turn ``usage`` events are made. OpenAI's accounting:
``input_tokens`` includes ``cached_input_tokens``.

A tool item becomes a ``tool_call`` when it starts and a ``tool_result`` when it
completes; an item first seen completed (a ``file_change`` is often emitted only then)
becomes both, so every call is counted once. Reasoning is not recorded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controlplane.workers.harness.stream_events import (
    NOTE_CHARS,
    HarnessEvent,
    Usage,
    as_int,
    as_text,
    cap,
    cap_arguments,
)
from controlplane.workers.harness.stream_lines import JsonLinesParser

__all__ = ["CodexStreamParser"]

_TOOLS = {"command_execution", "file_change", "mcp_tool_call", "web_search", "collab_tool_call"}
_QUIET_ITEMS = {"reasoning"}
_QUIET = {"item.plan.delta", "turn.diff", "token_count"}


class CodexStreamParser(JsonLinesParser):
    """``codex exec --json`` JSON lines."""

    harness = "codex"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._session: str | None = None
        self._turns = 0
        self._called: set[str] = set()  # item ids whose tool_call was emitted
        self._last_message = ""
        self._unknown: set[str] = set()

    def decode(self, obj: dict[str, Any]) -> list[HarnessEvent]:
        kind = obj.get("type")
        if kind == "thread.started":
            thread = obj.get("thread_id")
            if isinstance(thread, str) and thread and thread != self._session:
                self._session = cap(thread, NOTE_CHARS)
                return [HarnessEvent("session", session_id=self._session)]
            return []
        if kind == "turn.started":
            self._turns += 1
            self._last_message = ""
            return []
        if kind == "turn.completed":
            return [self._result(obj, failed=False)]
        if kind == "turn.failed":
            return [self._result(obj, failed=True)]
        if kind == "error":
            text = as_text(obj.get("message")) or "error"
            return [HarnessEvent("error", text=text, session_id=self._session)]
        if kind in ("item.started", "item.updated", "item.completed"):
            item = obj.get("item")
            if isinstance(item, Mapping):
                return self._item(item, completed=kind == "item.completed")
            return []
        if kind == "request_user_input":
            return [self._note("codex: the model asked for user input, which exec cannot give")]
        if isinstance(kind, str) and kind not in _QUIET:
            return self._unknown_note("event type", kind)
        return []

    # ------------------------------------------------------------------ items

    def _item(self, item: Mapping[str, Any], *, completed: bool) -> list[HarnessEvent]:
        kind = item.get("type")
        if kind == "agent_message":
            text = as_text(item.get("text"))
            if not completed or not text:
                return []
            self._last_message = text
            return [HarnessEvent("message", text=text, session_id=self._session)]
        if kind in _TOOLS:
            return self._tool(str(kind), item, completed=completed)
        if kind == "error":
            if not completed:
                return []
            return [self._note(f"codex: {as_text(item.get('message'), NOTE_CHARS)}")]
        if kind == "todo_list":
            return [self._note(f"codex plan: {_todo_text(item)}")] if completed else []
        if kind == "plan":
            plan = as_text(item.get("text"), NOTE_CHARS)
            return [self._note(f"codex plan: {plan}")] if completed else []
        if kind in _QUIET_ITEMS or not isinstance(kind, str):
            return []
        return self._unknown_note("item type", kind)

    def _tool(self, tool: str, item: Mapping[str, Any], *, completed: bool) -> list[HarnessEvent]:
        item_id = item.get("id")
        call_id = cap(item_id, NOTE_CHARS) if isinstance(item_id, str) and item_id else None
        files = _files(item) if tool == "file_change" else ()
        events: list[HarnessEvent] = []
        if call_id is None or call_id not in self._called:
            if call_id is not None:
                self._called.add(call_id)
            events.append(
                HarnessEvent(
                    "tool_call",
                    session_id=self._session,
                    tool=tool,
                    call_id=call_id,
                    arguments=_arguments(tool, item),
                    files=files,
                )
            )
        if completed:
            if call_id is not None:
                self._called.discard(call_id)
            text, is_error = _outcome(tool, item)
            events.append(
                HarnessEvent(
                    "tool_result",
                    text=text,
                    session_id=self._session,
                    tool=tool,
                    call_id=call_id,
                    files=files,
                    is_error=is_error,
                )
            )
        return events

    def _result(self, obj: Mapping[str, Any], *, failed: bool) -> HarnessEvent:
        if failed:
            error = obj.get("error")
            text = as_text(error.get("message")) if isinstance(error, Mapping) else ""
            return HarnessEvent(
                "result",
                text=text or "turn failed",
                session_id=self._session,
                is_error=True,
                turns=self._turns,
            )
        usage = obj.get("usage")
        totals = None
        if isinstance(usage, Mapping):
            totals = Usage(
                as_int(usage.get("input_tokens")),
                as_int(usage.get("output_tokens")),
                as_int(usage.get("cached_input_tokens")),
            )
        return HarnessEvent(
            "result",
            text=self._last_message,
            session_id=self._session,
            usage=totals,
            turns=self._turns,
        )

    def _unknown_note(self, what: str, kind: str) -> list[HarnessEvent]:
        if kind in self._unknown or len(self._unknown) >= 50:
            return []
        self._unknown.add(kind)  # a newer version's shape: say so once, then skip it
        return [self._note(f"codex: skipped {what} {kind!r}")]


def _arguments(tool: str, item: Mapping[str, Any]) -> dict[str, Any]:
    if tool == "command_execution":
        return cap_arguments({"command": item.get("command")})
    if tool == "file_change":
        changes = item.get("changes")
        kept = [
            {"path": c.get("path"), "kind": c.get("kind")}
            for c in (changes if isinstance(changes, list) else [])
            if isinstance(c, Mapping)
        ]
        return cap_arguments({"changes": kept})
    keys: tuple[str, ...]
    if tool == "mcp_tool_call":
        keys = ("server", "tool", "arguments")
    elif tool == "web_search":
        keys = ("query",)
    else:  # collab_tool_call
        keys = ("tool", "prompt", "receiver_thread_ids")
    return cap_arguments({k: item.get(k) for k in keys if k in item})


def _files(item: Mapping[str, Any]) -> tuple[str, ...]:
    changes = item.get("changes")
    if not isinstance(changes, list):
        return ()
    paths = [c.get("path") for c in changes if isinstance(c, Mapping)]
    return tuple(dict.fromkeys(cap(p, NOTE_CHARS) for p in paths if isinstance(p, str) and p))


def _outcome(tool: str, item: Mapping[str, Any]) -> tuple[str, bool]:
    """A completed tool item's result text and whether it failed."""
    status = item.get("status")
    failed = status in ("failed", "declined")
    if tool == "command_execution":
        text = as_text(item.get("aggregated_output"))
        code = item.get("exit_code")
        if isinstance(code, int) and not isinstance(code, bool) and code != 0:
            failed = True
            text = f"{text}\n[exit code {code}]" if text else f"[exit code {code}]"
        if status == "declined":
            text = text or "[declined]"
        return text, failed
    if tool == "file_change":
        changes = item.get("changes")
        lines = [
            f"{c.get('kind')} {c.get('path')}"
            for c in (changes if isinstance(changes, list) else [])[:200]
            if isinstance(c, Mapping)
        ]
        return cap("\n".join(lines)), failed
    if tool == "mcp_tool_call":
        error = item.get("error")
        if isinstance(error, Mapping) and error.get("message"):
            return as_text(error.get("message")), True
        result = item.get("result")
        content = result.get("content") if isinstance(result, Mapping) else None
        parts = [
            block["text"]
            for block in (content if isinstance(content, list) else [])[:200]
            if isinstance(block, Mapping) and isinstance(block.get("text"), str)
        ]
        return cap("\n".join(parts)), failed
    return "", failed


def _todo_text(item: Mapping[str, Any]) -> str:
    entries = item.get("items")
    lines = [
        f"[{'x' if e.get('completed') is True else ' '}] {e.get('text')}"
        for e in (entries if isinstance(entries, list) else [])[:50]
        if isinstance(e, Mapping)
    ]
    return cap("; ".join(lines), NOTE_CHARS)
