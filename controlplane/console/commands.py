"""Commands as the console shows them: what was run, where, and its output so far.

A command's output is stored whole in a blob, and its first and last
``output_inline_bytes`` inline on the row (``output_head``, ``output_tail``), updated as
chunks arrive. The console shows those two, joined when they meet; the full output is one
link away (``CommandQueue.output``).
"""

from __future__ import annotations

import shlex
from typing import Any

import asyncpg

from controlplane.db.pool import Db
from controlplane.domain import LIVE_COMMAND_STATES

COLUMNS = (
    "c.id, c.kind, c.spec, c.state, c.exit_code, c.error, c.refusal_reason, c.signal, "
    "c.timed_out, c.output_head, c.output_tail, c.output_size, c.approval_rule, "
    "c.approval_deadline, c.ticket_id, c.created_at, c.accepted_at, c.finished_at, "
    "d.name AS device"
)


def describe(kind: str, spec: dict[str, Any]) -> str:
    """One line saying what the command does (never a file's content)."""
    if kind == "exec":
        argv = [str(arg) for arg in spec.get("argv", [])]
        shell = len(argv) == 3 and argv[:2] == ["sh", "-c"]
        line = argv[2] if shell else shlex.join(argv)
        cwd = spec.get("cwd")
        return f"{line}  (in {cwd})" if cwd else line
    if kind in ("read_file", "write_file", "list_dir"):
        return f"{kind.replace('_', ' ')} {spec.get('path', '')}"
    if kind == "cancel":
        return f"cancel {spec.get('target_command_id', '')}"
    return kind


def output_text(head: bytes, tail: bytes, size: int) -> tuple[str, str, int]:
    """The inline output as text: its start, its end (empty when the start reaches it),
    and how many bytes between the two are not shown."""
    tail_start = size - len(tail)
    if tail_start <= len(head):
        return (head + tail[len(head) - tail_start :]).decode(errors="replace"), "", 0
    return head.decode(errors="replace"), tail.decode(errors="replace"), tail_start - len(head)


def view(row: asyncpg.Record) -> dict[str, Any]:
    start, end, hidden = output_text(row["output_head"], row["output_tail"], row["output_size"])
    return {
        "id": row["id"],
        "kind": row["kind"],
        "what": describe(row["kind"], row["spec"]),
        "device": row["device"],
        "ticket_id": row["ticket_id"],
        "state": row["state"],
        "live": row["state"] in LIVE_COMMAND_STATES,
        "exit_code": row["exit_code"],
        "signal": row["signal"],
        "timed_out": row["timed_out"],
        "error": row["error"] or row["refusal_reason"],
        "approval_rule": row["approval_rule"],
        "approval_deadline": row["approval_deadline"],
        "output": start,
        "output_end": end,
        "output_hidden_bytes": hidden,
        "output_size": row["output_size"],
        "created_at": row["created_at"],
        "accepted_at": row["accepted_at"],
        "finished_at": row["finished_at"],
    }


async def of_ticket(db: Db, ticket_id: str, *, limit: int = 50) -> list[dict[str, Any]]:
    """The ticket's latest commands, newest first."""
    rows = await db.fetch(
        f"SELECT {COLUMNS} FROM commands c JOIN devices d ON d.id = c.device_id "
        "WHERE c.ticket_id = $1 ORDER BY c.created_at DESC, c.seq DESC LIMIT $2",
        ticket_id,
        limit,
    )
    return [view(row) for row in rows]


async def awaiting_approval(db: Db, *, limit: int = 50) -> list[dict[str, Any]]:
    """Commands a device's local policy holds until a person there approves them."""
    rows = await db.fetch(
        f"SELECT {COLUMNS} FROM commands c JOIN devices d ON d.id = c.device_id "
        "WHERE c.state = 'awaiting_approval' ORDER BY c.created_at LIMIT $1",
        limit,
    )
    return [view(row) for row in rows]
