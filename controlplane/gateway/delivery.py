"""The gateway's side of the command queue: what a device's stream reads and records.

Commands are delivered in their per-device ``seq`` order by whichever replica holds the
device's stream (woken by NOTIFY on ``superagent_commands``, with a polling fallback).
Output is stored once per byte: chunks are written only at the next expected offset, in the
same transaction that advances ``output_size``, so resent chunks after a reconnect are
recognised and skipped. The first and last ``output_inline_bytes`` stay inline on the
command; the whole output is a chunked blob. A result is recorded as final once every output
byte is stored, and its waiters are told by NOTIFY on ``superagent_command_done``.

The workers' API to the same commands (submit, wait, output, cancel) is
:mod:`controlplane.gateway.queue`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg

from controlplane.domain import (
    LIVE_COMMAND_SQL,
    TERMINAL_COMMAND_SQL,
    TERMINAL_COMMAND_STATES,
    CommandState,
    Notify,
)
from controlplane.errors import NotFound
from controlplane.gateway import specs
from controlplane.gateway.queue import MAX_NOTIFY_PAYLOAD, CommandResult, result_json_sql

# Expire what waited too long (waking its waiters), then list what is left to deliver. The
# final SELECT sees the statement's snapshot, so it leaves the just-expired rows out itself.
_PENDING = f"""
WITH expired AS (
    UPDATE commands SET state = 'expired', finished_at = now(),
        error = 'not delivered before not_after'
    WHERE device_id = $1 AND state = 'queued' AND not_after < now()
    RETURNING id, pg_notify('{Notify.COMMAND_DONE}', id)
)
SELECT id, seq, kind, spec, not_after, origin, state, ticket_id,
       cancel_requested_at IS NOT NULL AS cancel_requested
FROM commands
WHERE device_id = $1 AND state IN ('queued', 'delivered')
  AND id NOT IN (SELECT id FROM expired)
ORDER BY seq
"""

# Record a final result unless it is already final or output up to $10 is still missing,
# and tell waiters: with the whole result as JSON when it fits in a notification (so a
# waiter needs no query of its own), else with the command id.
_FINISH = f"""
WITH current AS (
    SELECT id, state, output_size, output_blob_id, cancel_requested_at FROM commands
    WHERE id = $1 AND device_id = $2 FOR UPDATE
), done AS (
    UPDATE commands c SET
        state = CASE WHEN $3 = 'finished' AND current.cancel_requested_at IS NOT NULL
                          AND coalesce($5, 0) <> 0 THEN 'cancelled' ELSE $3 END,
        exit_code = $4, signal = nullif($5, 0), error = nullif($6, ''), refusal_reason = $7,
        timed_out = $8, output_truncated = $9, total_output_bytes = $10, finished_at = now()
    FROM current
    WHERE c.id = current.id
      AND current.state NOT IN ({TERMINAL_COMMAND_SQL})
      AND ($10::bigint IS NULL OR current.output_size >= $10::bigint)
    RETURNING {", ".join(f"c.{name}" for name in CommandResult.__dataclass_fields__)}
), sized AS (
    UPDATE blobs b SET size = done.output_size FROM done WHERE b.id = done.output_blob_id
)
SELECT current.state,
       current.output_size,
       (SELECT count(pg_notify('{Notify.COMMAND_DONE}',
                               CASE WHEN octet_length(told.result) <= {MAX_NOTIFY_PAYLOAD}
                                    THEN told.result ELSE done.id END))
        FROM done, LATERAL (SELECT json_build_object(
            {result_json_sql("done")}
        )::text AS result) told) AS recorded
FROM current
"""


@dataclass
class PendingCommand:
    id: str
    seq: int
    kind: str
    spec: specs.Spec
    not_after: datetime
    origin: str
    state: str
    cancel_requested: bool = False
    # The ticket it serves (None: no ticket); the device confines it to that ticket's
    # workspace.
    ticket_id: str | None = None


def announced_command(payload: str) -> tuple[str, PendingCommand | None]:
    """A ``Notify.COMMANDS`` payload: the device id, and the new command if it came along.

    Raises ValueError (or KeyError) for a payload that is JSON but not a command.
    """
    if not payload.startswith("{"):
        return payload, None
    data = json.loads(payload)
    command = PendingCommand(
        id=data["id"],
        seq=int(data["seq"]),
        kind=data["kind"],
        spec=specs.from_json(data["kind"], data["spec"]),
        not_after=datetime.fromtimestamp(float(data["not_after"]), UTC),
        origin=data["origin"],
        state=CommandState.QUEUED,
        ticket_id=data.get("ticket_id"),
    )
    return str(data["device_id"]), command


class CommandDelivery:
    """What a device's stream reads and records, over a raw asyncpg pool (the gateway's hot
    path)."""

    def __init__(self, pool: asyncpg.Pool, *, inline: int = 8192) -> None:
        self.pool = pool
        self.inline = inline  # bytes of output kept inline at each end (output_head, _tail)

    async def pending(self, device_id: str) -> list[PendingCommand]:
        """Commands to (re)deliver, in seq order; expired ones are marked and left out."""
        rows = await self.pool.fetch(_PENDING, device_id)
        return [
            PendingCommand(
                id=row["id"],
                seq=row["seq"],
                kind=row["kind"],
                spec=specs.from_json(row["kind"], row["spec"]),
                not_after=row["not_after"],
                origin=row["origin"],
                state=row["state"],
                cancel_requested=row["cancel_requested"],
                ticket_id=row["ticket_id"],
            )
            for row in rows
        ]

    async def cancel_unsent(self, device_id: str, command_ids: Sequence[str]) -> None:
        """Close commands whose cancel was requested and that never reached the device."""
        await self.pool.execute(
            "WITH cancelled AS (UPDATE commands SET state = 'cancelled', "
            "finished_at = now(), error = 'cancelled before delivery' "
            "WHERE id = ANY($1::text[]) AND device_id = $2 "
            "AND state IN ('queued', 'delivered') AND cancel_requested_at IS NOT NULL "
            "RETURNING id) SELECT count(pg_notify($3, id)) FROM cancelled",
            list(command_ids),
            device_id,
            Notify.COMMAND_DONE,
        )

    async def mark_delivered(self, command_ids: Sequence[str]) -> None:
        await self.pool.execute(
            "UPDATE commands SET state = 'delivered', delivered_at = now() "
            "WHERE id = ANY($1::text[]) AND state = 'queued'",
            list(command_ids),
        )

    async def mark_accepted(self, device_id: str, command_id: str) -> None:
        """The device's Accepted: on receipt, or again once a local approval let it start.

        The stream records an Accepted before a later AwaitingApproval of the same command
        (see ``DeviceStream._on_awaiting_approval``), so the first Accepted cannot land
        after, and undo, the wait.
        """
        await self.pool.execute(
            "UPDATE commands SET state = 'running', accepted_at = coalesce(accepted_at, now()), "
            "delivered_at = coalesce(delivered_at, now()) "
            "WHERE id = $1 AND device_id = $2 "
            "AND state IN ('queued', 'delivered', 'awaiting_approval')",
            command_id,
            device_id,
        )

    async def mark_awaiting_approval(
        self, device_id: str, command_id: str, *, rule: str | None, deadline: datetime | None
    ) -> None:
        """The device's AwaitingApproval: its local policy holds the command for a human.

        A command already final or producing output is left alone (a late or repeated
        message); the next Accepted, output or result moves it on.
        """
        await self.pool.execute(
            "UPDATE commands SET state = 'awaiting_approval', approval_rule = $3, "
            "approval_deadline = $4, accepted_at = coalesce(accepted_at, now()), "
            "delivered_at = coalesce(delivered_at, now()) "
            "WHERE id = $1 AND device_id = $2 "
            f"AND state IN ({LIVE_COMMAND_SQL}) AND output_size = 0",
            command_id,
            device_id,
            rule,
            deadline,
        )

    async def resume_approvals(
        self, device_id: str, *, running: Sequence[str], awaiting: Sequence[str]
    ) -> None:
        """Align with a Hello's in-flight states: what the device runs is no longer waiting
        for approval (the Accepted that said so may have been lost with the last stream),
        and what it holds for approval is shown so (its AwaitingApproval, likewise)."""
        await self.pool.execute(
            "UPDATE commands SET state = CASE WHEN state = 'awaiting_approval' THEN 'running' "
            "ELSE 'awaiting_approval' END, accepted_at = coalesce(accepted_at, now()), "
            "delivered_at = coalesce(delivered_at, now()) "
            "WHERE device_id = $1 AND ("
            "(id = ANY($2::text[]) AND state = 'awaiting_approval') OR "
            "(id = ANY($3::text[]) AND state IN ('queued', 'delivered', 'running') "
            "AND output_size = 0))",
            device_id,
            list(running),
            list(awaiting),
        )

    async def progress(
        self, device_id: str, command_ids: Sequence[str]
    ) -> dict[str, tuple[int, bool]]:
        """(stored output bytes, final?) for commands of this device, for resume acks."""
        rows = await self.pool.fetch(
            "SELECT id, output_size, state FROM commands "
            "WHERE id = ANY($1::text[]) AND device_id = $2",
            list(command_ids),
            device_id,
        )
        return {
            row["id"]: (row["output_size"], row["state"] in TERMINAL_COMMAND_STATES) for row in rows
        }

    async def store_output(self, device_id: str, command_id: str, offset: int, data: bytes) -> int:
        """Store ``data`` if it extends the output; return the new contiguous size.

        Bytes below the stored size are duplicates and skipped; a chunk beyond it (a gap)
        is not stored, and the returned size tells the device where to resume.
        """
        async with self.pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                "SELECT output_size, output_blob_id, state FROM commands "
                "WHERE id = $1 AND device_id = $2 FOR UPDATE",
                command_id,
                device_id,
            )
            if row is None:
                raise NotFound(f"device {device_id} has no command {command_id}")
            size: int = row["output_size"]
            if (
                offset > size
                or offset + len(data) <= size
                or row["state"] in TERMINAL_COMMAND_STATES
            ):
                return size
            new = data[size - offset :]
            await conn.execute(
                'INSERT INTO blob_chunks (blob_id, "offset", data) VALUES ($1, $2, $3) '
                "ON CONFLICT DO NOTHING",
                row["output_blob_id"],
                size,
                new,
            )
            head_part = new[: max(self.inline - size, 0)]
            await conn.execute(
                """
                UPDATE commands SET
                    output_size = $2,
                    output_head = output_head || $3,
                    output_tail = substring(output_tail || $4 from
                        greatest(length(output_tail || $4) - $5 + 1, 1)),
                    state = CASE WHEN state IN ('queued', 'delivered', 'awaiting_approval')
                                 THEN 'running' ELSE state END
                WHERE id = $1
                """,
                command_id,
                size + len(new),
                head_part,
                new[-self.inline :] if self.inline else b"",
                self.inline,
            )
            return size + len(new)

    async def finish(
        self,
        device_id: str,
        command_id: str,
        *,
        state: str,
        exit_code: int | None = None,
        signal: int | None = None,
        error: str | None = None,
        refusal_reason: str | None = None,
        timed_out: bool = False,
        output_truncated: bool = False,
        total_output_bytes: int | None = None,
    ) -> bool:
        """Record a final result; False while output up to ``total_output_bytes`` is missing.

        A command whose cancel was requested and that died by a signal counts as cancelled.
        """
        row = await self.pool.fetchrow(
            _FINISH,
            command_id,
            device_id,
            state,
            exit_code,
            signal,
            error or "",
            refusal_reason,
            timed_out,
            output_truncated,
            total_output_bytes,
        )
        if row is None:
            raise NotFound(f"device {device_id} has no command {command_id}")
        return bool(row["recorded"]) or row["state"] in TERMINAL_COMMAND_STATES

    async def held_needing_attention(self, replica_id: str) -> list[tuple[str, bool]]:
        """``(device id, revoked)`` for devices held by ``replica_id`` with queued work, and
        for devices revoked within the hour (revoking clears ``connected_replica``; a
        stream still open after that long would have been closed long before).

        Asked by replica rather than with a list of ids: a replica holding thousands of idle
        streams asks this every second."""
        rows = await self.pool.fetch(
            """
            SELECT DISTINCT c.device_id AS id, false AS revoked
            FROM commands c JOIN devices d ON d.id = c.device_id
            WHERE c.state = 'queued' AND d.connected_replica = $1
            UNION
            SELECT id, true FROM devices WHERE revoked_at > now() - interval '1 hour'
            """,
            replica_id,
        )
        return [(row["id"], row["revoked"]) for row in rows]
