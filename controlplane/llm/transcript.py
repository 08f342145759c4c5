"""Stored model messages read back: one spelling of a tool call, however it was written.

Used wherever calls are compared: one answer's repeated calls (``client.screen_calls``),
a worker looping on the same call (the watchdog), a worker's own history, and the rule
that stops a worker, a harness run or a router turn making the same call again and again
(:func:`looping`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


def canonical_arguments(arguments: Any) -> str:
    """Tool-call arguments as sorted, compact JSON; empty means ``{}``; unparsable JSON is
    kept as written (it still compares equal to itself)."""
    if arguments is None or arguments == "":
        arguments = "{}"
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return str(arguments)
    return json.dumps(parsed, sort_keys=True, separators=(",", ":"))


def canonical_call(call: dict[str, Any]) -> str:
    """A stored tool call's name and arguments, the same however the JSON was spelled."""
    function = call.get("function", {})
    return f"{function.get('name')}:{canonical_arguments(function.get('arguments'))}"


def message_content(value: Any) -> dict[str, Any]:
    """A ``session_messages.content`` value (JSON text or already decoded) as a dict."""
    parsed = json.loads(value) if isinstance(value, str) else value
    assert isinstance(parsed, dict)
    return parsed


def looping(signatures: Sequence[str], limit: int) -> str | None:
    """The tool's name when the last ``limit`` of ``signatures`` (``name:arguments``, as
    :func:`canonical_call` spells them, oldest first) are one and the same call: the model
    is in a loop, and the same call again would get the same answer. None otherwise."""
    recent = signatures[-limit:]
    if len(recent) == limit and len(set(recent)) == 1:
        return recent[0].split(":", 1)[0]
    return None
