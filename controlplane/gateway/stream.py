"""One device's Connect stream: handshake, resume, delivery, output, results, liveness.

Order of business on a new stream: send a Challenge; require a signed Hello within
``HELLO_TIMEOUT``; register with the hub (which closes any older stream of the device);
acknowledge what the device says it holds, so it resumes from the right offsets; then run
four loops until one ends: read device messages, write server messages (one writer, since
gRPC writes must not overlap), deliver queued commands, and store output; a timer sends
heartbeats and watches for silence. Memory per stream is bounded: output is buffered up to
``MAX_BUFFERED`` bytes before the reader waits for the store to catch up. An idle stream is
kept small (a replica holds thousands): two tasks wait on cheap signals rather than
``asyncio.Event``s and a ``Queue``, which allocate about 1 KiB and 3 KiB each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import grpc
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from controlplane.gateway import wire
from controlplane.gateway.queue import CommandQueue
from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_shared.protocol import PROTOCOL_VERSION_NUMBER, hello_signing_payload

if TYPE_CHECKING:
    from controlplane.gateway.hub import DeviceHub

log = logging.getLogger(__name__)

HELLO_TIMEOUT = 10.0
MAX_BUFFERED = 4 << 20
_FLUSH_BYTES = 1 << 20
SILENCE_FACTOR = 3  # heartbeats that may be missed before the stream counts as dead


class _Signal:
    """A set/clear flag to wait on, like ``asyncio.Event`` without its eager waiter deque."""

    __slots__ = ("_flag", "_waiters")

    def __init__(self) -> None:
        self._flag = False
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        self._flag = False

    async def wait(self) -> None:
        if self._flag:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if self._waiters is not None and waiter in self._waiters:
                self._waiters.remove(waiter)


class StreamClosed(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class _Buffer:
    start: int
    data: bytearray = field(default_factory=bytearray)


@dataclass
class _Result:
    state: str
    exit_code: int | None = None
    signal: int | None = None
    error: str | None = None
    refusal_reason: str | None = None
    timed_out: bool = False
    output_truncated: bool = False
    total_output_bytes: int | None = None


class DeviceStream:
    def __init__(
        self,
        hub: DeviceHub,
        queue: CommandQueue,
        context: grpc.aio.ServicerContext,
        *,
        heartbeat_seconds: float,
    ) -> None:
        self.hub = hub
        self.queue = queue
        self.context = context
        self.heartbeat_seconds = heartbeat_seconds
        self.device_id = ""
        self.stream_id = os.urandom(6).hex()
        self.wake = _Signal()
        self.closed = _Signal()
        self.close_reason: StreamClosed | None = None
        self._failure: BaseException | None = None  # why a loop ended the stream
        self._outbox: list[pb.ServerMessage] = []
        self._outbox_ready = _Signal()
        self._sent: set[str] = set()
        self._device_holds: set[str] = set()
        self._buffers: dict[str, _Buffer] = {}
        self._buffered = 0
        self._flush_wanted = _Signal()
        self._flush_lock = asyncio.Lock()  # chunks must reach the store in offset order
        self._drained = _Signal()
        self._drained.set()
        self._heartbeat: asyncio.TimerHandle | None = None
        self._marked: asyncio.Future[str] | None = None  # the handshake's "connected here"
        self._pending_results: dict[str, _Result] = {}
        self._last_received = time.monotonic()
        self._heartbeat_seq = 0
        self._peer_heartbeat_seq = 0

    # -- lifecycle -----------------------------------------------------------------------

    def close(self, code: grpc.StatusCode, message: str) -> None:
        """Ask the stream to end (revoked, replaced by a newer stream, replica stopping)."""
        if self.close_reason is None:
            self.close_reason = StreamClosed(code, message)
        self.closed.set()

    async def run(self) -> None:
        try:
            await self._handshake()
        except StreamClosed as closed:
            await self.context.abort(closed.code, closed.message)
        except BaseException:
            # The device went away mid-handshake (its RPC was cancelled) after the handshake
            # had marked it connected here; no other unregister would undo that.
            if self.device_id:
                await asyncio.shield(self._unmark())
            raise
        self.hub.register(self)
        try:
            tasks = [
                asyncio.create_task(self._read_loop(), name=f"{self.device_id}:read"),
                asyncio.create_task(self._write_loop(), name=f"{self.device_id}:write"),
                asyncio.create_task(self._deliver_loop(), name=f"{self.device_id}:deliver"),
                asyncio.create_task(self._flush_loop(), name=f"{self.device_id}:flush"),
            ]
            for task in tasks:
                task.add_done_callback(self._loop_ended)
            self._schedule_heartbeat()
            try:
                await self.closed.wait()  # close(), or a loop ended (_loop_ended)
            finally:
                if self._heartbeat is not None:
                    self._heartbeat.cancel()
                for task in tasks:
                    task.remove_done_callback(self._loop_ended)
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            failure = self._failure
            # What was already received is stored before the stream goes away. Shielded
            # here and below: gRPC cancels this task when the device's cancel arrives, often
            # while this cleanup runs, which must not be cut short.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._flush())
            if isinstance(failure, StreamClosed):
                self.close(failure.code, failure.message)
            elif failure is not None and not isinstance(failure, asyncio.CancelledError):
                log.warning("stream of %s failed: %r", self.device_id, failure)
                self.close(grpc.StatusCode.UNAVAILABLE, "gateway error; reconnect")
        finally:
            await asyncio.shield(self.hub.unregister(self))
        if self.close_reason is not None:
            await self.context.abort(self.close_reason.code, self.close_reason.message)

    async def _unmark(self) -> None:
        if self._marked is not None:
            with contextlib.suppress(Exception):
                await self._marked  # the mark must land before its undo
        await self.hub.unregister(self)

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        """Whatever ended one loop (they never return) ends the stream."""
        if self._failure is None and not task.cancelled():
            self._failure = task.exception()
        self.closed.set()

    def _send(self, message: pb.ServerMessage) -> None:
        self._outbox.append(message)
        self._outbox_ready.set()

    # -- handshake -----------------------------------------------------------------------

    async def _handshake(self) -> None:
        nonce = os.urandom(32)
        await self.context.write(
            pb.ServerMessage(
                challenge=pb.Challenge(
                    nonce=nonce,
                    server_time=wire.timestamp(datetime.now(UTC)),
                    protocol_version=PROTOCOL_VERSION_NUMBER,
                    heartbeat_interval_seconds=max(1, round(self.heartbeat_seconds)),
                )
            )
        )
        try:
            first = await asyncio.wait_for(self.context.read(), HELLO_TIMEOUT)
        except TimeoutError as exc:
            raise StreamClosed(grpc.StatusCode.UNAUTHENTICATED, "no Hello within 10 s") from exc
        if first is grpc.aio.EOF or not first.HasField("hello"):
            raise StreamClosed(grpc.StatusCode.UNAUTHENTICATED, "the first message must be a Hello")
        hello = first.hello
        if hello.protocol_version != PROTOCOL_VERSION_NUMBER:
            raise StreamClosed(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"protocol version {hello.protocol_version} is not supported; "
                f"this gateway speaks {PROTOCOL_VERSION_NUMBER}",
            )
        device = await self.queue.pool.fetchrow(
            "SELECT id, public_key, revoked_at FROM devices WHERE id = $1", hello.device_id
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
        self.device_id = hello.device_id
        # Shielded, and awaited again before any undo (run()): a cancelled RPC abandons the
        # await, not the statement, which could otherwise land after the undo.
        self._marked = asyncio.ensure_future(
            self.queue.pool.execute(
                "UPDATE devices SET version = $2, policy_hash = $3, last_seen_at = now(), "
                "connected_replica = $4, connected_at = now() WHERE id = $1",
                self.device_id,
                hello.daemon_version,
                hello.policy_hash.hex(),
                self.hub.replica_id,
            )
        )
        await asyncio.shield(self._marked)
        # Resume: tell the device what is durable, so it resends only what is missing.
        held = [item.command_id for item in hello.in_flight]
        self._device_holds = set(held)
        progress = await self.queue.progress(self.device_id, held)
        for item in hello.in_flight:
            size, final = progress.get(item.command_id, (0, True))
            self._send(
                pb.ServerMessage(
                    ack=pb.Ack(command_id=item.command_id, acked_output_offset=size, finished=final)
                )
            )
        self.wake.set()

    # -- loops ---------------------------------------------------------------------------

    async def _write_loop(self) -> None:
        while True:
            while not self._outbox:
                self._outbox_ready.clear()
                await self._outbox_ready.wait()
            batch, self._outbox = self._outbox, []
            for message in batch:
                await self.context.write(message)

    async def _read_loop(self) -> None:
        while True:
            message = await self.context.read()
            if message is grpc.aio.EOF:
                raise StreamClosed(grpc.StatusCode.CANCELLED, "device closed the stream")
            self._last_received = time.monotonic()
            self.hub.touch(self.device_id)
            kind = message.WhichOneof("msg")
            if kind == "heartbeat":
                self._peer_heartbeat_seq = max(self._peer_heartbeat_seq, message.heartbeat.seq)
            elif kind == "accepted":
                await self.queue.mark_accepted(self.device_id, message.accepted.command_id)
            elif kind == "output":
                await self._buffer_output(message.output)
            elif kind == "finished":
                await self._on_finished(message.finished)
            elif kind == "refused" and message.refused.reason == pb.Refused.REASON_DUPLICATE:
                # Same id, different content: the original command is still the device's,
                # and must not be closed by this refusal.
                log.warning(
                    "device %s refused a conflicting duplicate of %s",
                    self.device_id,
                    message.refused.command_id,
                )
            elif kind == "refused":
                refused = message.refused
                await self._complete(
                    refused.command_id,
                    _Result(
                        state="refused",
                        refusal_reason=wire.REFUSAL_REASONS.get(refused.reason, "unspecified"),
                        error=refused.message or None,
                    ),
                )
            else:
                raise StreamClosed(
                    grpc.StatusCode.INVALID_ARGUMENT, f"unexpected {kind} after the handshake"
                )

    async def _deliver_loop(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            fresh = []
            for command in await self.queue.pending(self.device_id):
                if command.id in self._sent or command.id in self._device_holds:
                    continue
                self._send(
                    wire.command_message(
                        command_id=command.id,
                        seq=command.seq,
                        not_after=command.not_after,
                        origin=command.origin,
                        spec=command.spec,
                    )
                )
                self._sent.add(command.id)
                fresh.append(command.id)
            if fresh:
                await self.queue.mark_delivered(fresh)

    def _schedule_heartbeat(self) -> None:
        loop = asyncio.get_running_loop()
        self._heartbeat = loop.call_later(self.heartbeat_seconds, self._on_heartbeat_timer)

    def _on_heartbeat_timer(self) -> None:
        """Every interval: end a silent stream, else send a heartbeat (a timer, not a task)."""
        if self.closed.is_set():
            return
        try:
            silent = time.monotonic() - self._last_received
            if silent > SILENCE_FACTOR * self.heartbeat_seconds:
                raise StreamClosed(
                    grpc.StatusCode.UNAVAILABLE, f"no message from the device for {silent:.0f} s"
                )
            self._heartbeat_seq += 1
            self._send(
                pb.ServerMessage(
                    heartbeat=pb.Heartbeat(
                        seq=self._heartbeat_seq,
                        sent_at=wire.timestamp(datetime.now(UTC)),
                        ack_seq=self._peer_heartbeat_seq,
                    )
                )
            )
            self._schedule_heartbeat()
        except Exception as exc:  # ends the stream as a failed loop would
            if self._failure is None:
                self._failure = exc
            self.closed.set()

    # -- output and results --------------------------------------------------------------

    async def _buffer_output(self, chunk: pb.OutputChunk) -> None:
        buffer = self._buffers.get(chunk.command_id)
        if buffer is not None and buffer.start + len(buffer.data) != chunk.offset:
            await self._flush()  # not contiguous: store what we have, then start afresh
            buffer = None
        if buffer is None:
            buffer = self._buffers[chunk.command_id] = _Buffer(chunk.offset)
        buffer.data += chunk.data
        self._buffered += len(chunk.data)
        self._flush_wanted.set()
        if self._buffered >= MAX_BUFFERED:
            self._drained.clear()
            await self._drained.wait()

    async def _flush_loop(self) -> None:
        while True:
            await self._flush_wanted.wait()
            self._flush_wanted.clear()
            await self._flush()

    async def _flush(self) -> None:
        async with self._flush_lock:
            await self._flush_locked()

    async def _flush_locked(self) -> None:
        while self._buffers:
            buffers, self._buffers = self._buffers, {}
            self._buffered = 0
            for command_id, buffer in buffers.items():
                data = bytes(buffer.data)
                size = buffer.start
                for start in range(0, len(data), _FLUSH_BYTES):
                    size = await self.queue.store_output(
                        self.device_id,
                        command_id,
                        buffer.start + start,
                        data[start : start + _FLUSH_BYTES],
                    )
                pending = self._pending_results.get(command_id)
                if pending is not None and size >= (pending.total_output_bytes or 0):
                    await self._complete(command_id, pending)
                else:
                    self._ack(command_id, size, finished=False)
        self._drained.set()

    async def _on_finished(self, finished: pb.Finished) -> None:
        error = finished.error or None
        if finished.timed_out and not error:
            error = "timed out"
        result = _Result(
            state="failed" if error else "finished",
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
        async with self._flush_lock:
            await self._flush_locked()
            await self._complete(finished.command_id, result)

    async def _complete(self, command_id: str, result: _Result) -> None:
        final = await self.queue.finish(
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
            self._pending_results.pop(command_id, None)
            self._device_holds.discard(command_id)
            self._ack(command_id, result.total_output_bytes or 0, finished=True)
        else:
            # Output is missing (lost with an earlier stream): ask for it from what we have.
            self._pending_results[command_id] = result
            progress = await self.queue.progress(self.device_id, [command_id])
            self._ack(command_id, progress.get(command_id, (0, False))[0], finished=False)

    def _ack(self, command_id: str, offset: int, *, finished: bool) -> None:
        self._send(
            pb.ServerMessage(
                ack=pb.Ack(command_id=command_id, acked_output_offset=offset, finished=finished)
            )
        )
