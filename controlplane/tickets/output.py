"""Inline & Spill for what a worker reads: head and tail inline, the rest behind an id.

A command's whole output stays in its blob; the model sees the first and last
:data:`INLINE_CHARS` characters and how to read the middle (``job_output(job, offset)``).
"""

from __future__ import annotations

from typing import Any

from controlplane.domain import CommandState
from controlplane.gateway.queue import CommandResult

INLINE_CHARS = 2000  # characters of head, and of tail, shown inline


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def inline(head: bytes, tail: bytes, size: int, job: str) -> dict[str, Any]:
    """The output as the model sees it: whole when short, else head + tail + a pointer."""
    if size <= 2 * INLINE_CHARS and len(head) + len(tail) >= size:
        whole = head + tail[len(head) + len(tail) - size :] if size > len(head) else head[:size]
        return {"output": _text(whole)}
    shown_head = head[:INLINE_CHARS]
    shown_tail = tail[-INLINE_CHARS:] if tail else b""
    omitted = size - len(shown_head) - len(shown_tail)
    return {
        "output_head": _text(shown_head),
        "output_tail": _text(shown_tail),
        "omitted_bytes": omitted,
        "read_more": f"job_output(job={job!r}, offset={len(shown_head)})",
    }


def describe(result: CommandResult) -> dict[str, Any]:
    """A finished (or still running) command's result for the model."""
    out: dict[str, Any] = {"job": result.id, "state": result.state}
    if result.exit_code is not None:
        out["exit_code"] = result.exit_code
    if result.signal:
        out["signal"] = result.signal
    if result.timed_out:
        out["timed_out"] = True
    if result.error:
        out["error"] = result.error
    if result.refusal_reason:
        out["refused"] = result.refusal_reason
    if result.state == CommandState.AWAITING_APPROVAL:
        out["note"] = (
            f"the device's owner must approve this locally (rule {result.approval_rule!r}); "
            "it runs once approved, and its result arrives as an event"
        )
    if result.output_size or result.done:
        out.update(inline(result.output_head, result.output_tail, result.output_size, result.id))
    if result.output_truncated:
        out["output_truncated"] = "the device's policy capped the output"
    return out
