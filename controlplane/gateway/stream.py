"""One device's Connect stream: handshake, resume, delivery, output, results, liveness.

Order of business on a new stream: send a Challenge; require a signed Hello within
``HELLO_TIMEOUT``; register with the hub (which closes any older stream of the device);
acknowledge what the device says it holds, so it resumes from the right offsets; then read
device messages until the stream ends. Memory per stream is bounded: output is buffered up
to ``MAX_BUFFERED`` bytes before the reader waits for the store to catch up.

A replica holds thousands of mostly idle streams, so an idle stream is one task (the RPC's
own, which reads) and a few small objects. Everything else runs in a task that exists only
while it has work (about 1.3 KiB each): writing queued messages (one writer at a time, since
gRPC writes must not overlap), delivering queued commands when woken, storing output.

Liveness: the device sends a heartbeat every interval and the reader answers each one at
once, so the device hears from the gateway every interval without a timer per stream. The
hub's once-a-second sweep (:meth:`DeviceStream.check_liveness`) ends a stream that has been
silent for ``SILENCE_FACTOR`` intervals, and sends a heartbeat of its own on a stream that
has sent nothing for ``FALLBACK_FACTOR`` intervals (a device whose heartbeats are late still
hears from us well before it gives up after three intervals).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import grpc
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from controlplane.domain import CommandState
from controlplane.errors import InvalidInput, NotFound
from controlplane.gateway import devices as registry
from controlplane.gateway import repositories, wire
from controlplane.gateway.delivery import CommandDelivery, PendingCommand
from superagent_shared import messages
from superagent_shared.protocol import (
    MAX_COMMAND_BYTES,
    MAX_OUTPUT_CHUNK_BYTES,
    Speaker,
    hello_signing_payload,
    incompatibility,
)

if TYPE_CHECKING:
    from controlplane.gateway.hub import DeviceHub

log = logging.getLogger(__name__)

HELLO_TIMEOUT = 10.0
MAX_BUFFERED = 4 << 20
_FLUSH_BYTES = 1 << 20
# An announced command is marked delivered this long after it was sent unless the device's
# Accepted (which marks both) came first.
MARK_DELIVERED_AFTER_SECONDS = 1.0
# An announced command this close to its not_after goes through the query, which expires it.
_OFFER_MARGIN_SECONDS = 5.0
SILENCE_FACTOR = 3  # heartbeats that may be missed before the stream counts as dead
# Intervals without anything sent before the sweep sends a heartbeat unprompted. Above 1, so
# that a device heartbeat arriving a little late is answered rather than crossed by a second
# server heartbeat; below SILENCE_FACTOR, so that the device never gives up on a live stream.
FALLBACK_FACTOR = 2


# A device's AwaitingApproval.rule is stored up to this many characters.
MAX_APPROVAL_RULE = 500
MAX_ID_CHARS = 100  # device and command ids are far shorter (``cmd_`` + 12 characters)
# A device's Hello.sandbox (one line describing how it confines commands) is stored up to
# this many characters.
MAX_SANDBOX = 1000
# Closes that are the device's fault (a protocol violation): logged once, as a warning.
_VIOLATIONS = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED})


# Shared empty sets, replaced by a stream's own on the first add: most streams of a replica
# never hold a command, and an empty set is 216 bytes.
_NO_IDS: frozenset[str] = frozenset()
_NO_TASKS: frozenset[asyncio.Task[None]] = frozenset()


class StreamClosed(Exception):
    def __init__(self, code: grpc.StatusCode, message: str, *, logged: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.logged = logged  # already logged where it was raised, with more detail


# Version refusals already logged as warnings, by (device, line): a daemon too old retries
# with its backoff for as long as it runs, and a fleet left behind by an upgrade would
# otherwise fill the log with the same lines. Bounded, oldest forgotten first.
_TOLD: OrderedDict[tuple[str, str], None] = OrderedDict()
_TOLD_MAX = 4096


def _log_version_refusal(device_id: str, line: str) -> None:
    key = (device_id, line)
    if key in _TOLD:
        _TOLD.move_to_end(key)
        log.debug("refused device %s again: %s", device_id, line)
        return
    _TOLD[key] = None
    if len(_TOLD) > _TOLD_MAX:
        _TOLD.popitem(last=False)
    log.warning("refused device %s: %s", device_id, line)


@dataclass
class _Buffer:
    start: int
    data: bytearray = field(default_factory=bytearray)


@dataclass
class _Result:
    state: CommandState
    exit_code: int | None = None
    signal: int | None = None
    error: str | None = None
    refusal_reason: str | None = None
    timed_out: bool = False
    output_truncated: bool = False
    total_output_bytes: int | None = None


class DeviceStream:
    __slots__ = (
        "_buffered",
        "_buffers",
        "_delivering",
        "_device_holds",
        "_drained",
        "_failure",
        "_flush_lock",
        "_flushing",
        "_heartbeat_seq",
        "_helpers",
        "_hold",
        "_interrupted",
        "_last_busy",
        "_marked",
        "_next_seq",
        "_outbox",
        "_peer_heartbeat_seq",
        "_pending_results",
        "_reading",
        "_sent",
        "_task",
        "_unaccepted",
        "_wake_again",
        "_writing",
        "close_reason",
        "connected_at_us",
        "context",
        "delivery",
        "device_id",
        "heartbeat_seconds",
        "hub",
        "last_received",
        "last_sent",
        "stream_id",
    )

    def __init__(
        self,
        hub: DeviceHub,
        delivery: CommandDelivery,
        context: grpc.aio.ServicerContext,
        *,
        heartbeat_seconds: float,
    ) -> None:
        self.hub = hub
        self.delivery = delivery
        self.context = context
        self.heartbeat_seconds = heartbeat_seconds
        self.device_id = ""
        self.stream_id = os.urandom(6).hex()
        # When the handshake marked the device connected, in microseconds by the database's
        # clock (one clock for every replica): which of two streams of a device is the newer.
        self.connected_at_us = 0
        self.close_reason: StreamClosed | None = None
        self._failure: BaseException | None = None  # why the stream failed, if it did
        self._task: asyncio.Task[object] | None = None  # the RPC's task, which reads
        self._reading = False  # in the read loop, where close() interrupts it
        self._interrupted = False  # close() or a failed helper cancelled the reader
        self._helpers: set[asyncio.Task[None]] | frozenset[asyncio.Task[None]] = _NO_TASKS
        # None rather than empty: most streams of a replica are idle, and an empty list or
        # dict is 56-64 bytes each (bench/RESULTS.md, idle fleet).
        self._outbox: list[wire.Outgoing] | None = None
        self._writing = False  # a write is in flight (the writer task's or the reader's)
        self._delivering = False
        self._wake_again = False
        # The seq the next new command of this device will have, once known (the handshake):
        # a command announced with exactly that seq can be sent without a query (offer()).
        self._next_seq: int | None = None
        self._flushing = False
        self._sent: set[str] | frozenset[str] = _NO_IDS  # commands sent on this stream
        # Announced commands sent and not yet accepted (see offer()).
        self._unaccepted: set[str] | frozenset[str] = _NO_IDS
        self._device_holds: set[str] | frozenset[str] = _NO_IDS  # listed in the Hello
        self._buffers: dict[str, _Buffer] | None = None
        self._buffered = 0
        self._flush_lock: asyncio.Lock | None = None  # see _lock()
        # Set while the reader waits for buffered output to be stored (backpressure).
        self._drained: asyncio.Future[None] | None = None
        self._marked: asyncio.Future[int | None] | None = None  # the handshake's "connected here"
        self._pending_results: dict[str, _Result] | None = None
        self.last_received = time.monotonic()  # read by the hub's liveness sweep
        self.last_sent = self.last_received
        self._last_busy = 0.0  # when the device last sent anything but a heartbeat
        self._heartbeat_seq = 0
        self._peer_heartbeat_seq = 0
        self._hold: asyncio.Future[None] | None = None  # the reader waiting for a write slot

    # -- lifecycle -----------------------------------------------------------------------

    def close(self, code: grpc.StatusCode, message: str) -> None:
        """Ask the stream to end (revoked, replaced by a newer stream, replica stopping)."""
        if self.close_reason is None:
            self.close_reason = StreamClosed(code, message)
        self._interrupt()

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
        self._interrupt()

    def _interrupt(self) -> None:
        """End the read loop, which ends the stream (a no-op before or after the loop)."""
        if self._reading and not self._interrupted and self._task is not None:
            self._interrupted = True
            self._task.cancel()

    async def run(self, speaks: Speaker) -> None:
        """Serve the stream; ``speaks``: this gateway's release and protocol versions."""
        self._task = asyncio.current_task()
        try:
            await self._handshake(speaks)
        except StreamClosed as closed:
            if not closed.logged:
                log.info("refused a device stream (%s): %s", self.stream_id, closed.message)
            await self.context.abort(closed.code, closed.message)
        except BaseException:
            # The device went away mid-handshake (its RPC was cancelled) after the handshake
            # had marked it connected here; no other unregister would undo that.
            if self.device_id:
                await asyncio.shield(self._unmark())
            raise
        self.hub.register(self)
        cancelled = False  # gRPC cancelled the RPC (the device's cancel arrived)
        try:
            # The RPC's own task reads, so an idle stream needs no task of its own; close()
            # and failed helpers end the stream by cancelling it (_interrupt).
            self._reading = True
            try:
                if self._outbox:  # the handshake's acks
                    self._writing = True
                    self._spawn(self._write_outbox(), "write")
                self.wake()  # anything queued while the device was away
                # The loop is here, not in a method of its own: one coroutine frame less
                # for each of a replica's idle streams to hold.
                while True:
                    message = await wire.read(self.context)
                    if message is None:
                        raise StreamClosed(grpc.StatusCode.CANCELLED, "device closed the stream")
                    await self._on_message(message)
            except asyncio.CancelledError:
                task = self._task
                if not self._interrupted or (task is not None and task.uncancel() > 0):
                    cancelled = True  # not (only) ours: clean up, then let it through
            except Exception as exc:
                # Not _fail(): that would cancel this very task, i.e. the cleanup below.
                if self._failure is None:
                    self._failure = exc
            finally:
                self._reading = False
            helpers = list(self._helpers)
            for helper in helpers:
                helper.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            failure = self._failure
            # What was already received is stored before the stream goes away. Shielded
            # here and below: gRPC cancels this task when the device's cancel arrives, often
            # while this cleanup runs, which must not be cut short.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._flush())
            if isinstance(failure, (InvalidInput, NotFound)):
                # The device's message named something it has no business with (another
                # device's command, one that does not exist): the device's fault, not ours.
                failure = StreamClosed(grpc.StatusCode.INVALID_ARGUMENT, failure.message)
            elif isinstance(failure, wire.Undecodable):
                failure = _undecodable()
            if isinstance(failure, StreamClosed):
                if failure.code in _VIOLATIONS:
                    log.warning("closed the stream of %s: %s", self.device_id, failure.message)
                self.close(failure.code, failure.message)
            elif failure is not None and not isinstance(failure, asyncio.CancelledError):
                log.warning("stream of %s failed: %r", self.device_id, failure)
                self.close(grpc.StatusCode.UNAVAILABLE, "gateway error; reconnect")
        finally:
            await asyncio.shield(self.hub.unregister(self))
        if cancelled:
            raise asyncio.CancelledError
        if self.close_reason is not None:
            await self.context.abort(self.close_reason.code, self.close_reason.message)

    async def _unmark(self) -> None:
        if self._marked is not None:
            with contextlib.suppress(Exception):
                await self._marked  # the mark must land before its undo
        await self.hub.unregister(self)

    def _spawn(self, work: Coroutine[object, object, None], name: str) -> None:
        """Run a helper; whatever makes it fail ends the stream."""
        task = asyncio.get_running_loop().create_task(work, name=f"{self.device_id}:{name}")
        if not isinstance(self._helpers, set):
            self._helpers = set()
        self._helpers.add(task)
        task.add_done_callback(self._helper_done)

    def _helper_done(self, task: asyncio.Task[None]) -> None:
        if isinstance(self._helpers, set):
            self._helpers.discard(task)
            if not self._helpers:
                self._helpers = _NO_TASKS
        if not task.cancelled() and task.exception() is not None:
            self._fail(task.exception())  # type: ignore[arg-type]

    # -- writing -------------------------------------------------------------------------

    def _send(self, message: wire.Outgoing) -> None:
        """Queue ``message``; a writer task runs while there is something to write."""
        if self._outbox is None:
            self._outbox = []
        self._outbox.append(message)
        if not self._writing and self._reading:
            # Outside the read loop nothing is written by a writer: before it, run() starts
            # one; after it the stream is about to be aborted, and what the final flush
            # acknowledges then, the device resends on its next stream anyway.
            self._writing = True
            self._spawn(self._write_outbox(), "write")

    async def _write_outbox(self) -> None:
        try:
            while self._outbox:
                batch, self._outbox = self._outbox, None
                for message in batch:
                    self.last_sent = time.monotonic()
                    await self._write(message)
        finally:
            self._writing = False

    async def _write(self, message: wire.Outgoing) -> None:
        """Write ``message`` to the device.

        A write that gRPC fails (InternalError: the batch failed; UsageError: the call has
        ended) means the device has gone: it cancelled the call, or the connection broke,
        and the cancellation of this RPC may reach us after the write failed. That is the
        device closing the stream, as a read finding its end is, not a gateway error.
        """
        try:
            await self.context.write(message)
        except (grpc.aio.InternalError, grpc.aio.UsageError) as exc:
            raise StreamClosed(grpc.StatusCode.CANCELLED, "device closed the stream") from exc

    async def _write_now(self, message: wire.Outgoing) -> None:
        """Write from the reader itself if no write is in flight (no task to start or wake)."""
        if self._writing or self._outbox:
            self._send(message)
            return
        self._writing = True
        try:
            self.last_sent = time.monotonic()
            await self._write(message)
        finally:
            self._writing = False
        if self._outbox and self._reading:  # queued while we wrote
            self._writing = True
            self._spawn(self._write_outbox(), "write")

    # -- liveness ------------------------------------------------------------------------

    def _heartbeat(self) -> wire.Outgoing:
        self._heartbeat_seq += 1
        return wire.heartbeat(seq=self._heartbeat_seq, ack_seq=self._peer_heartbeat_seq)

    def check_liveness(self, now: float) -> None:
        """The hub's sweep: end a silent stream; keep the device hearing from us."""
        if not self._reading:
            return
        silent = now - self.last_received
        if silent > SILENCE_FACTOR * self.heartbeat_seconds:
            self._fail(
                StreamClosed(
                    grpc.StatusCode.UNAVAILABLE, f"no message from the device for {silent:.0f} s"
                )
            )
        elif now - self.last_sent > FALLBACK_FACTOR * self.heartbeat_seconds:
            self.last_sent = now  # queued now; the writer sets it again when it writes
            self._send(self._heartbeat())

    # -- handshake -----------------------------------------------------------------------

    async def _handshake(self, speaks: Speaker) -> None:
        nonce = os.urandom(32)
        await self._write(
            wire.challenge(
                nonce=nonce,
                server_time=datetime.now(UTC),
                min_protocol_version=speaks.low,
                max_protocol_version=speaks.high,
                server_version=speaks.release,
                heartbeat_interval_seconds=max(1, round(self.heartbeat_seconds)),
            )
        )
        try:
            hello = await asyncio.wait_for(wire.read(self.context), HELLO_TIMEOUT)
        except TimeoutError as exc:
            raise StreamClosed(grpc.StatusCode.UNAUTHENTICATED, "no Hello within 10 s") from exc
        except wire.Undecodable:
            raise _undecodable() from None
        if not isinstance(hello, messages.Hello):  # None: the device closed the stream
            raise StreamClosed(grpc.StatusCode.UNAUTHENTICATED, "the first message must be a Hello")
        if not _valid_id(hello.device_id):
            raise StreamClosed(grpc.StatusCode.UNAUTHENTICATED, "unknown device; pair it again")
        device = await self.delivery.pool.fetchrow(
            "SELECT id, public_key, revoked_at, next_seq FROM devices WHERE id = $1",
            hello.device_id,
        )
        if device is None or device["public_key"] is None:
            raise StreamClosed(grpc.StatusCode.UNAUTHENTICATED, "unknown device; pair it again")
        try:
            Ed25519PublicKey.from_public_bytes(device["public_key"]).verify(
                hello.signature,
                hello_signing_payload(
                    nonce=nonce,
                    device_id=hello.device_id,
                    daemon_version=hello.daemon_version,
                    protocol_version=hello.protocol_version,
                    policy_hash=hello.policy_hash,
                ),
            )
        except (InvalidSignature, ValueError) as exc:
            raise StreamClosed(
                grpc.StatusCode.UNAUTHENTICATED, "Hello signature does not match the paired key"
            ) from exc
        if device["revoked_at"] is not None:
            raise StreamClosed(grpc.StatusCode.PERMISSION_DENIED, "this device has been revoked")
        # After the signature, so that the refusal logged names a device proven to be it
        # (which is why the Hello's layout stays the same in every protocol version).
        _check_version(hello, speaks)
        self.device_id = hello.device_id
        self._next_seq = device["next_seq"]  # older commands: the first delivery finds them
        # Shielded, and awaited again before any undo (run()): a cancelled RPC abandons the
        # await, not the statement, which could otherwise land after the undo.
        self._marked = asyncio.ensure_future(
            registry.connected(
                self.delivery.pool,
                self.device_id,
                hello.daemon_version,
                hello.policy_hash.hex(),
                self.hub.replica_id,
                # Unsigned, informational; empty from a daemon older than the field (NULL:
                # "unknown"). The signed policy_hash covers the mode it describes.
                _line(hello.sandbox)[:MAX_SANDBOX] or None,
            )
        )
        marked_at: int | None = await asyncio.shield(self._marked)  # None: device deleted
        self.connected_at_us = marked_at or 0
        self._marked = None  # landed; only needed for the undo above
        # Resume: tell the device what is durable, so it resends only what is missing.
        held = [item.command_id for item in hello.in_flight if _valid_id(item.command_id)]
        if held:
            self._device_holds = set(held)
        progress = await self.delivery.progress(self.device_id, held)
        running = [
            i.command_id for i in hello.in_flight if i.state == messages.InFlightState.RUNNING
        ]
        awaiting = [
            i.command_id
            for i in hello.in_flight
            if i.state == messages.InFlightState.AWAITING_APPROVAL
        ]
        if running or awaiting:
            await self.delivery.resume_approvals(self.device_id, running=running, awaiting=awaiting)
        for item in hello.in_flight:
            if not _valid_id(item.command_id):
                continue  # no such command; nothing to acknowledge
            size, final = progress.get(item.command_id, (0, True))
            self._send(wire.ack(item.command_id, size, finished=final))

    # -- reading and delivering ------------------------------------------------------

    async def _on_message(self, message: messages.DeviceMessage) -> None:
        self.last_received = now = time.monotonic()
        self.hub.touch(self.device_id)
        if isinstance(message, messages.Heartbeat):
            self._peer_heartbeat_seq = max(self._peer_heartbeat_seq, message.seq)
            # Answered, so the device hears from us every interval without a timer per
            # stream. An idle stream answers in the hub's next batch of writes, which
            # holds up its reading for up to WRITE_BATCH_SECONDS; a busy stream (anything
            # else received within an interval, output not yet stored) answers at once.
            busy = now - self._last_busy < self.heartbeat_seconds
            if not (busy or self._buffers or self._pending_results):
                await self._hold_for_write_slot()
            await self._write_now(self._heartbeat())
            return
        self._last_busy = now
        if isinstance(message, messages.Unknown):
            raise StreamClosed(
                grpc.StatusCode.INVALID_ARGUMENT,
                "an empty message, or one of a kind this gateway does not know, after the "
                "handshake; is endpointd newer than the control plane?",
            )
        if isinstance(message, messages.Hello):
            raise StreamClosed(
                grpc.StatusCode.INVALID_ARGUMENT, f"unexpected {message.KIND} after the handshake"
            )
        if isinstance(message, messages.RepositoryReport):
            await self._on_repositories(message)
            return
        _check(message)
        if isinstance(message, messages.OutputChunk):
            await self._buffer_output(message)
        elif isinstance(message, messages.Accepted):
            if isinstance(self._unaccepted, set):
                self._unaccepted.discard(message.command_id)
            # Not awaited: the command's output or result, often right behind, must not
            # wait for it, and a late mark never undoes them (it only moves a command
            # that is still queued or delivered to running).
            command_id = message.command_id
            self._spawn(
                self.delivery.mark_accepted(self.device_id, command_id), f"accepted:{command_id}"
            )
        elif isinstance(message, messages.Finished):
            await self._on_finished(message)
        elif isinstance(message, messages.AwaitingApproval):
            await self._on_awaiting_approval(message)
        elif message.reason == messages.Reason.DUPLICATE:
            # Same id, different content: the original command is still the device's,
            # and must not be closed by this refusal.
            log.warning(
                "device %s refused a conflicting duplicate of %s",
                self.device_id,
                message.command_id,
            )
        else:
            refused = message
            await self._complete(
                refused.command_id,
                _Result(
                    state=CommandState.REFUSED,
                    refusal_reason=messages.enum_name(refused.reason),
                    error=_text(refused.message) or None,
                ),
            )

    async def _on_repositories(self, report: messages.RepositoryReport) -> None:
        """The repositories the device found under its roots, stored for routing as this
        stream's device's (the report names no device). Awaited here: reports are rare,
        and a device sending them back to back waits for each to be stored."""
        await repositories.replace(self.delivery.pool, self.device_id, report)

    async def _hold_for_write_slot(self) -> None:
        """Until the hub's next batch of writes, or until a command is sent (see _send_command:
        the device's answers to it must not wait behind this)."""
        hold: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def release(_: object) -> None:
            if not hold.done():
                hold.set_result(None)

        # The shared slot is never awaited here, so never cancelled. Its callback is left in
        # place when the hold ends early (a no-op when it fires): removing it would scan
        # the callbacks of every stream waiting for the same batch.
        self.hub.write_slot().add_done_callback(release)
        self._hold = hold
        try:
            await hold
        finally:
            self._hold = None

    def wake(self) -> None:
        """Look for queued commands (a notification, the hub's poll, a new stream)."""
        if not self._reading:
            return
        if self._delivering:
            self._wake_again = True  # the running delivery looks again when done
            return
        self._delivering = True
        self._spawn(self._deliver(), "deliver")

    def offer(self, command: PendingCommand) -> None:
        """A command announced by its submit's notification: sent at once if it is next.

        Only when no delivery is running and its seq is the very next one: anything else
        (a gap left by an expired or cancelled command, one notification overtaking a
        delivery) falls back to the query, so commands still go out in seq order.
        """
        if (
            not self._reading
            or self._delivering
            or command.seq != self._next_seq
            or command.id in self._sent
            or command.not_after.timestamp() < time.time() + _OFFER_MARGIN_SECONDS
        ):
            self.wake()
            return
        self._send_command(command)
        # Marked delivered only if the device has not accepted it by then: its Accepted
        # (normally a millisecond away) records both, one statement instead of two.
        if not isinstance(self._unaccepted, set):
            self._unaccepted = set()
        self._unaccepted.add(command.id)
        asyncio.get_running_loop().call_later(
            MARK_DELIVERED_AFTER_SECONDS, self._mark_delivered_if_unaccepted, command.id
        )

    def _mark_delivered_if_unaccepted(self, command_id: str) -> None:
        if not isinstance(self._unaccepted, set) or command_id not in self._unaccepted:
            return
        self._unaccepted.discard(command_id)
        if self._reading:  # else it is still queued, and delivered again on the next stream
            self._spawn(self.delivery.mark_delivered([command_id]), "delivered")

    def _send_command(self, command: PendingCommand) -> None:
        message = wire.command_message(
            command_id=command.id,
            seq=command.seq,
            not_after=command.not_after,
            origin=command.origin,
            spec=command.spec,
            ticket_id=command.ticket_id or "",
        )
        size = wire.encoded_size(message)
        if size > MAX_COMMAND_BYTES:
            # Queued before the queue checked sizes (CommandQueue.submit): the device could
            # not read it, and its stream would end on it, again on every new one.
            log.error("not sending %s to %s: %d bytes", command.id, self.device_id, size)
            too_big = _Result(
                state=CommandState.FAILED,
                error=f"the command is {size} bytes; a device takes at most {MAX_COMMAND_BYTES}",
            )
            self._spawn(self._complete(command.id, too_big), f"too-big:{command.id}")
            return
        self._send(message)
        if not isinstance(self._sent, set):
            self._sent = set()
        self._sent.add(command.id)
        self._next_seq = max(self._next_seq or 0, command.seq + 1)
        self._last_busy = time.monotonic()  # its answers are not to be held up
        if self._hold is not None and not self._hold.done():
            self._hold.set_result(None)  # nor those already on their way

    async def _deliver(self) -> None:
        try:
            self._wake_again = True
            while self._wake_again:
                self._wake_again = False
                fresh = []
                unsent = []
                for command in await self.delivery.pending(self.device_id):
                    self._next_seq = max(self._next_seq or 0, command.seq + 1)
                    if command.id in self._sent or command.id in self._device_holds:
                        continue  # the device has it (a requested cancel reaches it too)
                    if command.cancel_requested:
                        unsent.append(command.id)  # cancelled while on no device's stream
                        continue
                    self._send_command(command)
                    fresh.append(command.id)
                if unsent:
                    await self.delivery.cancel_unsent(self.device_id, unsent)
                if fresh:
                    await self.delivery.mark_delivered(fresh)
        finally:
            self._delivering = False

    # -- output and results --------------------------------------------------------------

    async def _buffer_output(self, chunk: messages.OutputChunk) -> None:
        buffer = self._buffers.get(chunk.command_id) if self._buffers else None
        if buffer is not None and buffer.start + len(buffer.data) != chunk.offset:
            await self._flush()  # not contiguous: store what we have, then start afresh
            buffer = None
        if buffer is None:
            if self._buffers is None:
                self._buffers = {}
            buffer = self._buffers[chunk.command_id] = _Buffer(chunk.offset)
        buffer.data += chunk.data
        self._buffered += len(chunk.data)
        if not self._flushing:
            self._flushing = True
            self._spawn(self._flush_soon(), "flush")
        if self._buffered >= MAX_BUFFERED:
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained

    async def _flush_soon(self) -> None:
        try:
            # Output buffered while this runs is taken by _flush_locked's own loop, which
            # returns (and clears the flag) without yielding once the buffers are empty.
            await self._flush()
        finally:
            self._flushing = False

    async def _flush(self) -> None:
        async with self._lock():
            await self._flush_locked()

    def _lock(self) -> asyncio.Lock:
        """The flush lock (chunks must reach the store in offset order), made when needed."""
        if self._flush_lock is None:
            self._flush_lock = asyncio.Lock()
        return self._flush_lock

    async def _flush_locked(self) -> None:
        while self._buffers:
            buffers, self._buffers = self._buffers, None
            self._buffered = 0
            for command_id, buffer in buffers.items():
                data = bytes(buffer.data)
                size = buffer.start
                for start in range(0, len(data), _FLUSH_BYTES):
                    size = await self.delivery.store_output(
                        self.device_id,
                        command_id,
                        buffer.start + start,
                        data[start : start + _FLUSH_BYTES],
                    )
                pending = (self._pending_results or {}).get(command_id)
                if pending is not None and size >= (pending.total_output_bytes or 0):
                    await self._complete(command_id, pending)
                else:
                    self._ack(command_id, size, finished=False)
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    async def _on_awaiting_approval(self, waiting: messages.AwaitingApproval) -> None:
        """The device's local policy holds the command until a human there decides."""
        # Its Accepted came just before and is recorded by a task of its own (see above);
        # landing after this, it would move the command back to running.
        accepted = f"{self.device_id}:accepted:{waiting.command_id}"
        earlier = [task for task in self._helpers if task.get_name() == accepted]
        if earlier:
            await asyncio.wait(earlier)
        await self.delivery.mark_awaiting_approval(
            self.device_id,
            waiting.command_id,
            rule=_text(waiting.rule)[:MAX_APPROVAL_RULE] or None,
            deadline=messages.utc(waiting.deadline),
        )

    async def _on_finished(self, finished: messages.Finished) -> None:
        error = _text(finished.error) or None
        if finished.timed_out and not error:
            error = "timed out"
        result = _Result(
            state=CommandState.FAILED if error else CommandState.FINISHED,
            exit_code=finished.exit_code,
            signal=finished.signal,
            error=error,
            timed_out=finished.timed_out,
            output_truncated=finished.output_truncated,
            total_output_bytes=finished.total_output_bytes,
        )
        # Under the flush lock: the output received before this Finished may be on its way
        # to the store in the flush loop right now. Judged before that store, the result
        # would wait for bytes that the flush loop had already acked without seeing it.
        async with self._lock():
            await self._flush_locked()
            await self._complete(finished.command_id, result)

    async def _complete(self, command_id: str, result: _Result) -> None:
        final = await self.delivery.finish(
            self.device_id,
            command_id,
            state=result.state,
            exit_code=result.exit_code,
            signal=result.signal,
            error=result.error,
            refusal_reason=result.refusal_reason,
            timed_out=result.timed_out,
            output_truncated=result.output_truncated,
            total_output_bytes=result.total_output_bytes,
        )
        if final:
            if self._pending_results is not None:
                self._pending_results.pop(command_id, None)
            if isinstance(self._device_holds, set):
                self._device_holds.discard(command_id)
            self._ack(command_id, result.total_output_bytes or 0, finished=True)
        else:
            # Output is missing (lost with an earlier stream): ask for it from what we have.
            if self._pending_results is None:
                self._pending_results = {}
            self._pending_results[command_id] = result
            progress = await self.delivery.progress(self.device_id, [command_id])
            self._ack(command_id, progress.get(command_id, (0, False))[0], finished=False)

    def _ack(self, command_id: str, offset: int, *, finished: bool) -> None:
        self._send(wire.ack(command_id, offset, finished=finished))


def _undecodable() -> StreamClosed:
    return StreamClosed(
        grpc.StatusCode.INVALID_ARGUMENT, "a message that does not parse as a DeviceMessage"
    )


def _valid_id(value: str) -> bool:
    """Whether ``value`` could be one of our ids (Postgres text holds no NUL)."""
    return 0 < len(value) <= MAX_ID_CHARS and "\x00" not in value


def _check(
    message: messages.Accepted
    | messages.OutputChunk
    | messages.Finished
    | messages.Refused
    | messages.AwaitingApproval,
) -> None:
    """Refuse what no well-behaved device sends: bad ids, chunks over the protocol's size."""
    if not _valid_id(message.command_id):
        raise StreamClosed(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{message.KIND}: the command id must be 1 to {MAX_ID_CHARS} characters without NUL",
        )
    if isinstance(message, messages.OutputChunk) and len(message.data) > MAX_OUTPUT_CHUNK_BYTES:
        raise StreamClosed(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"an output chunk of {len(message.data)} bytes; the protocol allows 64 KiB",
        )


def _text(value: str) -> str:
    """A device's text for the database, which stores no NUL characters."""
    return value.replace("\x00", "")


def _line(value: str) -> str:
    """A device's one-line text, shown as is in terminals: no control characters."""
    return "".join(ch if ch.isprintable() else " " for ch in value).strip()


def _check_version(hello: messages.Hello, speaks: Speaker) -> None:
    """Refuse a Hello whose daemon shares no protocol version with this gateway, with the
    one line that names both versions and the fix; or one that chose a version either side
    does not speak (a broken daemon)."""
    # A daemon older than the range fields speaks its protocol_version alone.
    daemon = Speaker.stated(
        _line(hello.daemon_version)[:MAX_ID_CHARS],
        hello.min_protocol_version or hello.protocol_version,
        hello.max_protocol_version or hello.protocol_version,
    )
    line = incompatibility(daemon, speaks)
    if line is not None:
        _log_version_refusal(hello.device_id, line)
        raise StreamClosed(grpc.StatusCode.FAILED_PRECONDITION, line, logged=True)
    if not (speaks.speaks(hello.protocol_version) and daemon.speaks(hello.protocol_version)):
        raise StreamClosed(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"protocol version {hello.protocol_version} is not one both sides speak "
            f"(the daemon: {daemon.protocols}; this gateway: {speaks.protocols})",
        )
