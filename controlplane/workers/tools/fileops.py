"""What the file tools share: a file operation on the ticket's device, its whole answer,
and the one way a failure reads (a quick operation, waited for; a device away leaves it
queued, as any job)."""

from __future__ import annotations

from typing import Any

from controlplane.gateway import specs
from controlplane.gateway.queue import CommandResult
from controlplane.workers.tools.core import Call

FILE_WAIT_SECONDS = 30.0  # file operations are quick on a connected device


async def file_op(call: Call, spec: specs.Spec) -> CommandResult:
    return await call.bench.run(spec, FILE_WAIT_SECONDS, call_id=call.id, script=spec.KIND)


def failed(path: str, result: CommandResult) -> dict[str, Any]:
    return {"path": path, "error": result.error or result.refusal_reason or result.state}


async def whole_output(call: Call, result: CommandResult) -> bytes:
    """Every byte a finished operation answered: from the result when head and tail hold
    it all, else from its stored output."""
    head, tail, size = result.output_head, result.output_tail, result.output_size
    if size <= len(head):
        return head[:size]
    if len(head) + len(tail) >= size:
        return head + tail[len(head) + len(tail) - size :]
    return await call.bench.queue.output(result.id, 0, size)
