"""The durable per-device command queue in Postgres: the workers' API to it.

:meth:`CommandQueue.submit` gives a command its per-device ``seq`` and wakes the replica
holding the device's stream (NOTIFY on ``superagent_commands``); :meth:`~CommandQueue.wait`
returns its result once final (woken by NOTIFY on ``superagent_command_done``),
:meth:`~CommandQueue.output` reads its stored output and :meth:`~CommandQueue.cancel` stops
it. The workers, the router's ``/run``, ticket control and the console use this side.

The queue's other half, what a device's stream reads and records (delivery in ``seq`` order,
output stored once per byte, results), is :mod:`controlplane.gateway.delivery`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from controlplane.db.listen import Listener, listen
from controlplane.db.pool import Conn, Db
from controlplane.domain import TERMINAL_COMMAND_STATES, CommandState, Notify
from controlplane.errors import InvalidInput, NotFound
from controlplane.gateway import specs, wire
from controlplane.gateway.authorization import covered_sql, refusal
from controlplane.gateway.devices import ONLINE_WINDOW
from superagent_shared.ids import new_id
from superagent_shared.protocol import MAX_COMMAND_BYTES

log = logging.getLogger(__name__)

_LISTENER_IDLE = 1.0  # seconds without waiters before the LISTEN connection is returned
# Commands submitted while the LISTEN connection was up, remembered for a later wait()
# (see CommandQueue._watched); the oldest are forgotten beyond this many.
_MAX_WATCHED = 10_000
# In _watched: the command's done notification came without the result (too large).
_TOLD_BY_ID = "told by id"


@dataclass(frozen=True)
class CommandResult:
    id: str
    device_id: str
    kind: str
    state: str
    exit_code: int | None
    signal: int | None
    error: str | None
    refusal_reason: str | None
    timed_out: bool
    output_truncated: bool
    output_size: int
    output_head: bytes
    output_tail: bytes
    output_blob_id: str | None
    # Set once the device said it waits for local approval (state ``awaiting_approval``);
    # kept after the decision.
    approval_rule: str | None = None
    approval_deadline: datetime | None = None

    @property
    def done(self) -> bool:
        return self.state in TERMINAL_COMMAND_STATES

    @property
    def ok(self) -> bool:
        return self.state == CommandState.FINISHED and self.exit_code == 0 and not self.signal

    @property
    def output_complete(self) -> bool:
        """True when head and tail together are the whole output."""
        return len(self.output_head) + len(self.output_tail) >= self.output_size

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> CommandResult:
        return cls(**{name: row[name] for name in cls.__dataclass_fields__})

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CommandResult:
        """From the JSON a done notification carries (:func:`result_json_sql`)."""
        # .get: a replica of the previous release does not send the newer fields.
        fields: dict[str, Any] = {name: data.get(name) for name in cls.__dataclass_fields__}
        for name in _BYTES_FIELDS:
            fields[name] = base64.b64decode(fields[name] or "")
        if fields["approval_deadline"] is not None:
            fields["approval_deadline"] = datetime.fromisoformat(fields["approval_deadline"])
        return cls(**fields)


def done_command_id(payload: str) -> str:
    """The command id in a ``Notify.COMMAND_DONE`` payload: a bare id, or a result as JSON."""
    if payload.startswith("{"):
        command_id = json.loads(payload)["id"]
        assert isinstance(command_id, str)
        return command_id
    return payload


# Sent base64 in a done notification's JSON.
_BYTES_FIELDS = ("output_head", "output_tail")


def result_json_sql(row: str) -> str:
    """The arguments of ``json_build_object`` that make a done notification's JSON of
    ``row``'s result columns (read back by :meth:`CommandResult.from_json`)."""
    return ", ".join(
        f"'{name}', encode({row}.{name}, 'base64')"
        if name in _BYTES_FIELDS
        else f"'{name}', {row}.{name}"
        for name in CommandResult.__dataclass_fields__
    )


class _Waiter:
    """One wait() call: woken by a done notification, with the result if it carried one."""

    __slots__ = ("event", "result")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.result: CommandResult | None = None


_RESULT_COLUMNS = ", ".join(CommandResult.__dataclass_fields__)

# NOTIFY payloads must stay under 8000 bytes.
MAX_NOTIFY_PAYLOAD = 7900

# Allocate the device's next seq, create the output blob, insert the command and wake the
# replica holding the device's stream: one statement, so one round trip and atomic. A
# ticket's command is queued only on a device the ticket's recorded grant still covers
# (defence in depth below every entry point's own check; controlplane.gateway.authorization). The
# notification carries the command itself when it fits (see ``delivery.announced_command``),
# so the replica can send it without a query.
_SUBMIT = f"""
WITH dev AS (
    UPDATE devices SET next_seq = next_seq + 1
    WHERE (id = $1 OR name = $1) AND revoked_at IS NULL
      AND ($4::text IS NULL OR {covered_sql("devices.id", "$4::text")})
    RETURNING id, next_seq - 1 AS seq
), blob AS (
    INSERT INTO blobs (id, content_type, size)
    SELECT $2, 'application/octet-stream', 0 FROM dev
    RETURNING id
), cmd AS (
    INSERT INTO commands (id, device_id, ticket_id, seq, kind, spec, credential_names, state,
                          not_after, origin, output_blob_id)
    SELECT $3, dev.id, $4, dev.seq, $5, $6::text::jsonb, $7, 'queued', now() + $8::interval,
           $9, blob.id
    FROM dev, blob
    RETURNING id, device_id, ticket_id, seq, kind, spec, not_after, origin
)
SELECT cmd.id,
       pg_notify('{Notify.COMMANDS}',
                 CASE WHEN octet_length(told.command) <= {MAX_NOTIFY_PAYLOAD}
                      THEN told.command ELSE cmd.device_id END)
FROM cmd, LATERAL (SELECT json_build_object(
    'device_id', cmd.device_id, 'id', cmd.id, 'seq', cmd.seq, 'kind', cmd.kind,
    'spec', cmd.spec, 'not_after', extract(epoch FROM cmd.not_after), 'origin', cmd.origin,
    'ticket_id', cmd.ticket_id
)::text AS command) told
"""


def check_size(spec: specs.Spec, *, origin: str = "", ticket_id: str | None = None) -> None:
    """Refuse a command larger than a device can receive (InvalidInput, saying so): it
    could never be read there, and its delivery would end the device's stream, again on
    every new one."""
    size = wire.encoded_size(
        wire.command_message(
            command_id=new_id("cmd"),
            seq=1 << 62,
            not_after=datetime.now().astimezone(),
            origin=origin,
            spec=spec,
            ticket_id=ticket_id or "",
        )
    )
    if size > MAX_COMMAND_BYTES:
        raise InvalidInput(
            f"the {spec.KIND} command is {size} bytes; a device takes at most"
            f" {MAX_COMMAND_BYTES} in one command: split the content or the input"
        )


class CommandQueue:
    """The workers' side of the command queue, over a raw asyncpg pool."""

    def __init__(
        self, pool: asyncpg.Pool, *, ttl: timedelta = timedelta(hours=12), inline: int = 8192
    ) -> None:
        self.pool = pool
        self.ttl = ttl
        self.inline = inline  # a result's output_head and output_tail hold this many bytes
        self._waiters: dict[str, set[_Waiter]] = {}
        self._listener: Listener | None = None  # on a pool connection, while waited on
        self._listener_lock = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()
        # Commands submitted here while the LISTEN connection was up: their done
        # notification cannot be missed, so wait() needs no query to learn that one is not
        # done yet (None), or what it ended as (the result). Emptied whenever that
        # connection goes, since notifications may be lost then.
        self._watched: OrderedDict[str, CommandResult | str | None] = OrderedDict()
        self._last_used = 0.0
        self._idle_timer: asyncio.TimerHandle | None = None
        self._listener_generation = 0  # bumped whenever the LISTEN connection comes or goes

    async def submit(
        self,
        device: str,
        spec: specs.Spec,
        *,
        ticket_id: str | None = None,
        origin: str = "",
        ttl: timedelta | None = None,
    ) -> str:
        """Queue ``spec`` for ``device`` (id or name); returns the command id."""
        specs.validate(spec)
        check_size(spec, origin=origin, ticket_id=ticket_id)
        names = [c.name for c in spec.credentials] if isinstance(spec, specs.Exec) else []
        # LISTENing since before this statement: its done notification will reach us.
        listening = self._listening()
        generation = self._listener_generation
        # One statement, so one round trip and atomic without an explicit transaction.
        command_id = await self.pool.fetchval(
            _SUBMIT,
            device,
            new_id("blb"),
            new_id("cmd"),
            ticket_id,
            spec.KIND,
            json.dumps(specs.to_json(spec)),
            names,
            self.ttl if ttl is None else ttl,
            origin,
        )
        if command_id is None:
            found = await self.pool.fetchval(
                "SELECT id FROM devices WHERE (id = $1 OR name = $1) AND revoked_at IS NULL",
                device,
            )
            if found is not None and ticket_id is not None:
                raise await refusal(self.pool, str(found), ticket_id)
            raise NotFound(f"no paired device {device!r}")
        assert isinstance(command_id, str)
        if listening and self._listening() and generation == self._listener_generation:
            self._last_used = asyncio.get_running_loop().time()
            self._watched[command_id] = None
            if len(self._watched) > _MAX_WATCHED:
                self._watched.popitem(last=False)
        return command_id

    async def result(self, command_id: str) -> CommandResult:
        row = await self.pool.fetchrow(
            f"SELECT {_RESULT_COLUMNS} FROM commands WHERE id = $1", command_id
        )
        if row is None:
            raise NotFound(f"no command {command_id!r}")
        return CommandResult.from_row(row)

    async def wait(self, command_id: str, timeout: float) -> CommandResult:
        """The command's result once final, or its current state when ``timeout`` passes."""
        waiter = _Waiter()
        self._waiters.setdefault(command_id, set()).add(waiter)
        try:
            await self._ensure_listener()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            # None: not done yet, known without a query (see _watched).
            result: CommandResult | None
            told_before = self._watched.pop(command_id, _TOLD_BY_ID)
            if isinstance(told_before, CommandResult) or told_before is None:
                result = told_before
            else:
                result = await self.result(command_id)
            while result is None or not result.done:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                # The poll is the safety net for a notification lost on the way.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiter.event.wait(), min(remaining, 1.0))
                waiter.event.clear()
                told, waiter.result = waiter.result, None
                result = told if told is not None else await self.result(command_id)
            if result is None:  # the timeout passed before anything was read
                result = await self.result(command_id)
            return result
        finally:
            self._last_used = asyncio.get_running_loop().time()
            waiters = self._waiters.get(command_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[command_id]
            if not self._waiters:
                # Keep the LISTEN connection through bursts, give it back when idle, so
                # closing the pool never waits on it for long.
                self._release_when_idle()

    def _on_done(self, text: str) -> None:
        result: CommandResult | None = None
        if text.startswith("{"):
            try:
                result = CommandResult.from_json(json.loads(text))
            except (ValueError, KeyError, TypeError):
                log.warning("unreadable done notification; waiters will query")
                return
            command_id = result.id
        else:
            command_id = text
        if command_id in self._watched:
            self._watched[command_id] = result if result is not None else _TOLD_BY_ID
        for waiter in self._waiters.get(command_id, ()):
            waiter.result = result
            waiter.event.set()

    async def _ensure_listener(self) -> None:
        """One LISTEN connection per queue for every waiter, held from the pool on first use
        (kept up by db/listen.py; while it is down, waiters poll)."""
        async with self._listener_lock:
            if self._listener is None:
                self._listener = await listen(
                    self.pool,
                    on_notify={Notify.COMMAND_DONE: self._on_done},
                    on_connect=self._listener_changed,
                    on_lost=self._listener_changed,
                    name="command waiters",
                ).start()

    def _listener_changed(self) -> None:
        """The LISTEN connection came or went: notifications may have been lost."""
        self._listener_generation += 1
        self._watched.clear()

    def _listening(self) -> bool:
        return self._listener is not None and self._listener.listening

    def _release_when_idle(self) -> None:
        """Give the LISTEN connection back once unused for _LISTENER_IDLE (one timer)."""
        if self._idle_timer is None:
            loop = asyncio.get_running_loop()
            self._idle_timer = loop.call_later(_LISTENER_IDLE, self._release_if_idle)

    def _release_if_idle(self) -> None:
        self._idle_timer = None
        if self._waiters or self._listener is None:
            return
        loop = asyncio.get_running_loop()
        idle = loop.time() - self._last_used
        if idle < _LISTENER_IDLE:  # used again since: look again when it may be idle
            self._idle_timer = loop.call_later(_LISTENER_IDLE - idle, self._release_if_idle)
            return
        task = loop.create_task(self.close())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        """Give back the LISTEN connection (also done by itself after a second idle)."""
        async with self._listener_lock:
            listener, self._listener = self._listener, None
            if listener is not None:
                self._listener_changed()
                await listener.close()

    async def output(self, command_id: str, offset: int = 0, limit: int = 65536) -> bytes:
        """Bytes ``[offset, offset + limit)`` of the command's stored output."""
        if offset < 0 or limit < 0:
            raise InvalidInput("offset and limit must not be negative")
        blob_id = await self.pool.fetchval(
            "SELECT output_blob_id FROM commands WHERE id = $1", command_id
        )
        if blob_id is None:
            raise NotFound(f"no command {command_id!r}")
        rows = await self.pool.fetch(
            """
            SELECT "offset", data FROM blob_chunks
            WHERE blob_id = $1 AND "offset" < $2::bigint + $3::bigint
              AND "offset" + length(data) > $2::bigint
            ORDER BY "offset"
            """,
            blob_id,
            offset,
            limit,
        )
        out = bytearray()
        for row in rows:
            start = max(offset - row["offset"], 0)
            out += row["data"][start : start + limit - len(out)]
        return bytes(out)

    async def cancel(self, command_id: str, *, grace_seconds: int = 0) -> CommandResult:
        """Cancel: a queued command never runs; a running one is killed on the device.

        A queued command of a device that is online may already be on its way to it (sent
        from its submit's notification, recorded as delivered only once accepted), so it is
        cancelled through the device like a delivered one: its stream cancels it unsent if
        it was not sent, and the device kills it if it was. Only for an offline device is it
        cancelled here and now. The device's row is locked for this, so a stream that comes
        up meanwhile delivers either after the cancel or before the check, never between.
        """
        async with self.pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                "SELECT c.device_id, c.state, c.cancel_requested_at, "
                "       d.connected_replica IS NOT NULL "
                "       AND d.last_seen_at > now() - $2::interval AS online "
                "FROM commands c JOIN devices d ON d.id = c.device_id "
                "WHERE c.id = $1 FOR UPDATE OF c FOR SHARE OF d",
                command_id,
                ONLINE_WINDOW,
            )
            if row is None:
                raise NotFound(f"no command {command_id!r}")
            if row["state"] == CommandState.QUEUED and not row["online"]:
                await conn.execute(
                    "UPDATE commands SET state = 'cancelled', cancel_requested_at = now(), "
                    "finished_at = now(), error = 'cancelled before delivery' WHERE id = $1",
                    command_id,
                )
                await conn.execute("SELECT pg_notify($1, $2)", Notify.COMMAND_DONE, command_id)
                needs_device = False
            else:
                needs_device = (
                    row["state"] not in TERMINAL_COMMAND_STATES
                    and row["cancel_requested_at"] is None
                )
                if needs_device:
                    await conn.execute(
                        "UPDATE commands SET cancel_requested_at = now() WHERE id = $1",
                        command_id,
                    )
        if needs_device:
            await self.submit(
                row["device_id"],
                specs.Cancel(command_id, grace_seconds),
                origin=f"cancel of {command_id}",
            )
        return await self.result(command_id)


# -- commands ended from outside the queue's own flow (the watchdog, a reroute) ----------


async def expire_undelivered(db: Db, device_id: str) -> list[str]:
    """Commands queued for ``device_id`` past their ``not_after``, the device still away:
    expired, and their waiters told. Their ids."""
    rows = await db.fetch(
        "UPDATE commands SET state = 'expired', finished_at = now(), "
        "error = 'not delivered before not_after (the device stayed away)' "
        "WHERE device_id = $1 AND state = 'queued' AND not_after < now() "
        "RETURNING id, pg_notify($2, id)",
        device_id,
        Notify.COMMAND_DONE,
    )
    return [row["id"] for row in rows]


async def cancel_queued_elsewhere(conn: Conn, ticket_id: str, device_id: str) -> list[str]:
    """The ticket moved to ``device_id``: what it still had queued for another device is
    cancelled before delivery, and its waiters told. Their ids."""
    rows = await conn.fetch(
        "UPDATE commands SET state = 'cancelled', cancel_requested_at = now(), "
        "finished_at = now(), error = 'the ticket moved to another device' "
        "WHERE ticket_id = $1 AND device_id <> $2 AND state = 'queued' "
        "RETURNING id, pg_notify($3, id)",
        ticket_id,
        device_id,
        Notify.COMMAND_DONE,
    )
    return [row["id"] for row in rows]
