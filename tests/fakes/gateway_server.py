"""A scriptable device gateway for tests: speaks the real protocol, records everything.

Owned by the test suite. It plays the control plane's side of ``superagent.endpoint.v1``
against a real ``endpointd`` process, and doubles as a "rogue control plane" for policy
tests: every message can be scripted, and nothing a device sends is trusted.

* ``FakeGateway(tls=True)`` - a real gRPC server (grpc.aio) on ``127.0.0.1`` with an
  ephemeral port, run in a background thread with its own event loop, so tests may block
  (``subprocess.run``) freely. With ``tls=True`` it serves a fresh private CA + leaf (SANs
  ``superagent-gateway``, ``localhost``, ``127.0.0.1``) presenting the chain ``[leaf, CA]``
  exactly like a self-signed deployment; ``tls=False`` serves plaintext (loopback only).
  ``url``, ``certs`` and ``fingerprint`` tell a test what to pair with.
* Pairing: ``add_pairing_code(code)`` (optionally ``error=(StatusCode, message)`` to script
  a refusal, or ``device_id=``); codes are single-use. ``pair_response_hook`` may tamper
  with the PairResponse (interception tests). Paired public keys are kept and every Hello
  signature is verified against them (UNAUTHENTICATED if bad or unknown, PERMISSION_DENIED
  after ``revoke(device_id)``).
* Connect: the Challenge carries ``heartbeat_interval`` (seconds) and the server time
  (shifted by ``clock_offset`` seconds to simulate skew). ``send(device_id, command)``
  fills in ``command_id``/``seq`` if unset, queues the command (delivered at the next
  Hello if the device is offline) and returns it; ``redeliver(command)`` resends exactly
  the same bytes. ``drop(device_id)`` ends the current stream with a status;
  ``silent = True`` stops all server traffic (heartbeats and acks) without closing;
  ``send_heartbeats = False`` stops only heartbeats; ``answer_heartbeats = True`` answers
  each device heartbeat, as the real gateway does (``answer_delay`` seconds later).
  ``redeliver_unanswered = True`` sends every command the device has neither answered nor
  listed in its Hello again on each new stream, as the real gateway does with a command
  still ``delivered``.
* Acks: ``auto_ack=True`` acks every chunk as it arrives (next contiguous offset) and every
  Finished/Refused once all output up to ``total_output_bytes`` is stored, and answers a
  Hello's in-flight list with one Ack per command (the server's stored offset). With
  ``auto_ack=False`` the test acks by hand with ``ack(...)``.
* Records: ``messages(kind=...)``, ``output(command_id)`` (contiguous bytes from offset 0,
  resends deduped by offset), ``chunks``, ``finished``, ``refused``, ``accepted_count``,
  ``hellos``, ``heartbeats``, ``sessions``; ``violations`` lists protocol breaches seen
  (oversized chunk, a resend whose bytes differ, a gap). ``on_message`` is called for
  every device message (from the server thread).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Self

import grpc
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from google.protobuf.timestamp_pb2 import Timestamp

from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_proto.v1 import endpoint_pb2_grpc
from superagent_shared.gateway_tls import (
    GatewayCertificates,
    format_fingerprint,
    generate_gateway_certificates,
)
from superagent_shared.ids import new_id
from superagent_shared.protocol import (
    MAX_OUTPUT_CHUNK_BYTES,
    PROTOCOL_VERSION_NUMBER,
    hello_signing_payload,
)
from tests.fakes.loopback import Lifecycle

__all__ = [
    "FakeGateway",
    "Session",
    "exec_command",
    "gateway",
    "plain_gateway",
]


@dataclass
class _Pairing:
    device_id: str | None
    error: tuple[grpc.StatusCode, str] | None


@dataclass
class _Drop:
    code: grpc.StatusCode
    details: str


@dataclass
class Session:
    """One Connect stream, as the server saw it."""

    index: int
    device_id: str = ""
    hello: pb.Hello | None = None
    received: list[pb.DeviceMessage] = field(default_factory=list)
    ended: bool = False
    outbox: asyncio.Queue[pb.ServerMessage | _Drop] = field(default_factory=asyncio.Queue)
    heartbeat_seq: int = 0


@dataclass
class _Output:
    pieces: dict[int, bytes] = field(default_factory=dict)
    streams: dict[int, int] = field(default_factory=dict)

    def contiguous(self) -> bytes:
        out = bytearray()
        for offset in sorted(self.pieces):
            if offset > len(out):
                break
            data = self.pieces[offset]
            if offset + len(data) > len(out):
                out += data[len(out) - offset :]
        return bytes(out)


def exec_command(
    argv: list[str],
    *,
    command_id: str = "",
    cwd: str = "",
    env: dict[str, str] | None = None,
    timeout_seconds: int = 0,
    stdin: bytes | None = None,
    not_after: float | None = None,
) -> pb.Command:
    ex = pb.ExecCommand(argv=argv, cwd=cwd, env=env or {}, timeout_seconds=timeout_seconds)
    if stdin is not None:
        ex.stdin = stdin
    command = pb.Command(command_id=command_id, exec=ex, origin="test")
    if not_after is not None:
        command.not_after.FromNanoseconds(int(not_after * 1e9))
    return command


class FakeGateway(Lifecycle):
    def __init__(
        self,
        *,
        tls: bool = True,
        heartbeat_interval: int = 15,
        auto_ack: bool = True,
        server_name: str = "fake superagent",
        clock_offset: float = 0.0,
    ) -> None:
        self.tls = tls
        self.heartbeat_interval = heartbeat_interval
        self.auto_ack = auto_ack
        self.server_name = server_name
        self.clock_offset = clock_offset
        self.silent = False
        self.send_heartbeats = True
        self.answer_heartbeats = False  # answer each device heartbeat, as the gateway does
        self.answer_delay = 0.0  # seconds before an answer is sent (a round trip, say)
        self.redeliver_unanswered = False  # resend unanswered commands on a new stream
        self.certs: GatewayCertificates | None = (
            generate_gateway_certificates(extra_dns_names=["localhost"], extra_ips=["127.0.0.1"])
            if tls
            else None
        )
        self.pair_response_hook: Callable[[pb.PairResponse], pb.PairResponse] | None = None
        self.on_message: Callable[[Session, pb.DeviceMessage], None] | None = None
        self.port = 0
        self.pair_requests: list[pb.PairRequest] = []
        self.keys: dict[str, bytes] = {}
        self.revoked: set[str] = set()
        self.sessions: list[Session] = []
        self.violations: list[str] = []
        self.sent_commands: dict[str, pb.Command] = {}
        self._sent_to: dict[str, str] = {}  # command id -> device id
        self._codes: dict[str, _Pairing] = {}
        self._current: dict[str, Session] = {}
        self._pending: dict[str, list[pb.Command]] = {}
        self._outputs: dict[str, _Output] = {}
        self._results: dict[str, pb.DeviceMessage] = {}
        self._acked_finished: set[str] = set()
        self._seq: dict[str, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: grpc.aio.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def fingerprint(self) -> str:
        assert self.certs is not None, "a plaintext gateway has no certificate"
        return format_fingerprint(self.certs.cert_sha256)

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._thread_main, name="fake-gateway", daemon=True)
        self._thread.start()
        if not self._ready.wait(15):
            raise RuntimeError("fake gateway did not start")
        return self

    def _thread_main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        loop.run_until_complete(self._serve())
        loop.run_forever()
        loop.close()

    async def _serve(self) -> None:
        server = grpc.aio.server(
            options=[
                # Accept the daemon's 20 s keepalive pings without "too_many_pings".
                ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.max_ping_strikes", 0),
            ]
        )
        endpoint_pb2_grpc.add_EndpointGatewayServicer_to_server(_Servicer(self), server)
        if self.certs is not None:
            creds = grpc.ssl_server_credentials(
                [(self.certs.key_pem, self.certs.cert_pem + self.certs.ca_pem)]
            )
            self.port = server.add_secure_port("127.0.0.1:0", creds)
        else:
            self.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self._server = server
        self._ready.set()

    def _call(self, fn: Callable[[], Any]) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(fn)

    def _run(self, coro: Any, timeout: float = 15) -> Any:
        assert self._loop is not None
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    def stop(self) -> None:
        """Close the server (streams end with UNAVAILABLE) and its thread."""
        if self._loop is None or self._server is None:
            return
        server = self._server
        self._server = None
        self._run(server.stop(grace=0))
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None
        self._thread.join(10)

    # ------------------------------------------------------------------ scripting

    def add_pairing_code(
        self,
        code: str,
        *,
        device_id: str | None = None,
        error: tuple[grpc.StatusCode, str] | None = None,
    ) -> str:
        with self._lock:
            self._codes[code] = _Pairing(device_id, error)
        return code

    def register_device(self, public_key: bytes, device_id: str | None = None) -> str:
        """Register a key without the Pair call (for tests that start already paired)."""
        device_id = device_id or new_id("dev")
        self.keys[device_id] = public_key
        return device_id

    def revoke(self, device_id: str) -> None:
        self.revoked.add(device_id)
        self.drop(device_id, grpc.StatusCode.PERMISSION_DENIED, "device revoked")

    def next_seq(self, device_id: str) -> int:
        with self._lock:
            self._seq[device_id] = self._seq.get(device_id, 0) + 1
            return self._seq[device_id]

    def send(self, device_id: str, command: pb.Command) -> pb.Command:
        """Queue ``command`` (id and seq filled in if unset); returns what was sent."""
        sent = pb.Command()
        sent.CopyFrom(command)
        if not sent.command_id:
            sent.command_id = new_id("cmd")
        if not sent.seq:
            sent.seq = self.next_seq(device_id)
        self.sent_commands[sent.command_id] = sent
        self._sent_to[sent.command_id] = device_id
        self._deliver(device_id, sent)
        return sent

    def redeliver(self, device_id: str, command: pb.Command) -> None:
        """Send exactly this command again (same id, seq and bytes)."""
        self._deliver(device_id, command)

    def _deliver(self, device_id: str, command: pb.Command) -> None:
        def go() -> None:
            session = self._current.get(device_id)
            if session is None or session.ended:
                self._pending.setdefault(device_id, []).append(command)
            else:
                session.outbox.put_nowait(pb.ServerMessage(command=command))

        self._call(go)

    def ack(self, device_id: str, command_id: str, offset: int, *, finished: bool = False) -> None:
        message = pb.ServerMessage(
            ack=pb.Ack(command_id=command_id, acked_output_offset=offset, finished=finished)
        )
        if finished:
            self._acked_finished.add(command_id)
        self._push(device_id, message)

    def _push(self, device_id: str, message: pb.ServerMessage | _Drop) -> None:
        def go() -> None:
            session = self._current.get(device_id)
            if session is not None and not session.ended:
                session.outbox.put_nowait(message)

        self._call(go)

    def drop(
        self,
        device_id: str,
        code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
        details: str = "dropped by test",
    ) -> None:
        """End the device's current stream with ``code``."""
        self._push(device_id, _Drop(code, details))

    # ------------------------------------------------------------------ records

    def connected(self, device_id: str) -> Session | None:
        session = self._current.get(device_id)
        return session if session is not None and not session.ended else None

    def session_count(self, device_id: str) -> int:
        return sum(1 for s in list(self.sessions) if s.device_id == device_id)

    def messages(self, kind: str | None = None) -> list[pb.DeviceMessage]:
        out: list[pb.DeviceMessage] = []
        for session in list(self.sessions):
            for message in list(session.received):
                if kind is None or message.WhichOneof("msg") == kind:
                    out.append(message)
        return out

    def hellos(self, device_id: str | None = None) -> list[pb.Hello]:
        return [
            s.hello
            for s in list(self.sessions)
            if s.hello is not None and (device_id is None or s.device_id == device_id)
        ]

    def heartbeats(self) -> list[pb.Heartbeat]:
        return [m.heartbeat for m in self.messages("heartbeat")]

    def chunks(self, command_id: str) -> list[pb.OutputChunk]:
        return [m.output for m in self.messages("output") if m.output.command_id == command_id]

    def output(self, command_id: str, stream: int | None = None) -> bytes:
        if stream is None:
            store = self._outputs.get(command_id)
            return store.contiguous() if store else b""
        seen: dict[int, bytes] = {}
        for chunk in self.chunks(command_id):
            if chunk.stream == stream:
                seen[chunk.offset] = chunk.data
        return b"".join(seen[o] for o in sorted(seen))

    def finished(self, command_id: str) -> pb.Finished | None:
        result = self._results.get(command_id)
        return result.finished if result is not None and result.HasField("finished") else None

    def refused(self, command_id: str) -> pb.Refused | None:
        found = [m.refused for m in self.messages("refused") if m.refused.command_id == command_id]
        return found[-1] if found else None

    def accepted_count(self, command_id: str) -> int:
        return sum(1 for m in self.messages("accepted") if m.accepted.command_id == command_id)

    def result_count(self, command_id: str) -> int:
        return sum(
            1
            for m in self.messages()
            if (m.HasField("finished") and m.finished.command_id == command_id)
            or (m.HasField("refused") and m.refused.command_id == command_id)
        )

    # ------------------------------------------------------------------ server side

    def _verify_hello(self, nonce: bytes, hello: pb.Hello) -> tuple[grpc.StatusCode, str] | None:
        key = self.keys.get(hello.device_id)
        if key is None:
            return grpc.StatusCode.UNAUTHENTICATED, "unknown device"
        if hello.device_id in self.revoked:
            return grpc.StatusCode.PERMISSION_DENIED, "device revoked"
        payload = hello_signing_payload(
            nonce=nonce,
            device_id=hello.device_id,
            daemon_version=hello.daemon_version,
            protocol_version=hello.protocol_version,
            policy_hash=hello.policy_hash,
        )
        try:
            Ed25519PublicKey.from_public_bytes(key).verify(hello.signature, payload)
        except InvalidSignature:
            return grpc.StatusCode.UNAUTHENTICATED, "bad Hello signature"
        return None

    def _record(self, session: Session, message: pb.DeviceMessage) -> None:
        session.received.append(message)
        kind = message.WhichOneof("msg")
        if kind == "output":
            self._record_output(session, message.output)
        elif kind in ("finished", "refused"):
            result = getattr(message, kind)
            self._results[result.command_id] = message
            self._maybe_ack_result(session, result.command_id)
        if self.on_message is not None:
            self.on_message(session, message)

    def _record_output(self, session: Session, chunk: pb.OutputChunk) -> None:
        if len(chunk.data) > MAX_OUTPUT_CHUNK_BYTES:
            self.violations.append(f"{chunk.command_id}: chunk of {len(chunk.data)} bytes")
        store = self._outputs.setdefault(chunk.command_id, _Output())
        previous = store.pieces.get(chunk.offset)
        if previous is not None and not (
            previous.startswith(chunk.data) or chunk.data.startswith(previous)
        ):
            self.violations.append(f"{chunk.command_id}: resend at {chunk.offset} differs")
        if previous is None or len(chunk.data) > len(previous):
            store.pieces[chunk.offset] = chunk.data
        have = len(store.contiguous())
        if chunk.offset > have:
            self.violations.append(f"{chunk.command_id}: gap before offset {chunk.offset}")
        if self.auto_ack and not self.silent:
            session.outbox.put_nowait(
                pb.ServerMessage(ack=pb.Ack(command_id=chunk.command_id, acked_output_offset=have))
            )

    def _maybe_ack_result(self, session: Session, command_id: str) -> None:
        if not self.auto_ack or self.silent:
            return
        result = self._results[command_id]
        total = result.finished.total_output_bytes if result.HasField("finished") else 0
        store = self._outputs.get(command_id)
        have = len(store.contiguous()) if store else 0
        if have >= total:
            self._acked_finished.add(command_id)
            session.outbox.put_nowait(
                pb.ServerMessage(
                    ack=pb.Ack(command_id=command_id, acked_output_offset=total, finished=True)
                )
            )

    def _redeliver_unanswered(self, session: Session, hello: pb.Hello, queued: set[str]) -> None:
        held = {item.command_id for item in hello.in_flight} | queued
        for command_id, command in list(self.sent_commands.items()):
            if (
                self._sent_to.get(command_id) == hello.device_id
                and command_id not in self._results
                and command_id not in held
            ):
                session.outbox.put_nowait(pb.ServerMessage(command=command))

    def _resume_acks(self, session: Session, hello: pb.Hello) -> None:
        for item in hello.in_flight:
            store = self._outputs.get(item.command_id)
            have = len(store.contiguous()) if store else 0
            session.outbox.put_nowait(
                pb.ServerMessage(
                    ack=pb.Ack(
                        command_id=item.command_id,
                        acked_output_offset=have,
                        finished=item.command_id in self._acked_finished,
                    )
                )
            )


class _Servicer(endpoint_pb2_grpc.EndpointGatewayServicer):
    def __init__(self, gateway: FakeGateway) -> None:
        self.gw = gateway

    async def Pair(
        self, request: pb.PairRequest, context: grpc.aio.ServicerContext
    ) -> pb.PairResponse:
        gw = self.gw
        gw.pair_requests.append(request)
        with gw._lock:
            plan = gw._codes.pop(request.pairing_code, None)
        if plan is None:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED, "invalid or expired pairing code"
            )
        assert plan is not None
        if plan.error is not None:
            await context.abort(*plan.error)
        if len(request.public_key) != 32:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "public_key must be 32 bytes")
        device_id = gw.register_device(request.public_key, plan.device_id)
        response = pb.PairResponse(device_id=device_id, server_name=gw.server_name)
        if gw.certs is not None:
            response.server_cert_sha256 = gw.certs.cert_sha256
            response.server_ca_pem = gw.certs.ca_pem.decode()
        if gw.pair_response_hook is not None:
            response = gw.pair_response_hook(response)
        return response

    async def Connect(  # type: ignore[override]  # grpc.aio read/write style
        self,
        request_iterator: AsyncIterator[pb.DeviceMessage],
        context: grpc.aio.ServicerContext,
    ) -> None:
        gw = self.gw
        session = Session(index=len(gw.sessions))
        gw.sessions.append(session)
        nonce = os.urandom(32)
        server_time = Timestamp()
        server_time.FromNanoseconds(int((time.time() + gw.clock_offset) * 1e9))
        await context.write(
            pb.ServerMessage(
                challenge=pb.Challenge(
                    nonce=nonce,
                    server_time=server_time,
                    protocol_version=PROTOCOL_VERSION_NUMBER,
                    heartbeat_interval_seconds=gw.heartbeat_interval,
                )
            )
        )
        first = await context.read()
        if first is grpc.aio.EOF or not first.HasField("hello"):
            session.ended = True
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "first message must be Hello")
        hello = first.hello
        session.device_id = hello.device_id
        session.hello = hello
        refusal = gw._verify_hello(nonce, hello)
        if refusal is not None:
            session.ended = True
            await context.abort(*refusal)
        previous = gw._current.get(hello.device_id)
        if previous is not None and not previous.ended:
            previous.outbox.put_nowait(_Drop(grpc.StatusCode.ABORTED, "superseded"))
        gw._current[hello.device_id] = session
        if gw.auto_ack:
            gw._resume_acks(session, hello)
        pending = gw._pending.pop(hello.device_id, [])
        for command in pending:
            session.outbox.put_nowait(pb.ServerMessage(command=command))
        if gw.redeliver_unanswered:
            gw._redeliver_unanswered(session, hello, {c.command_id for c in pending})

        reader = asyncio.create_task(self._read(context, session))
        beats = asyncio.create_task(self._heartbeats(session))
        try:
            while True:
                item = await session.outbox.get()
                if isinstance(item, _Drop):
                    session.ended = True
                    await context.abort(item.code, item.details)
                if gw.silent:
                    continue
                await context.write(item)
        finally:
            session.ended = True
            reader.cancel()
            beats.cancel()

    async def _read(self, context: grpc.aio.ServicerContext, session: Session) -> None:
        while True:
            message = await context.read()
            if message is grpc.aio.EOF:
                session.outbox.put_nowait(_Drop(grpc.StatusCode.CANCELLED, "device closed"))
                return
            self.gw._record(session, message)
            if self.gw.answer_heartbeats and message.HasField("heartbeat") and not self.gw.silent:
                session.heartbeat_seq += 1
                answer = pb.ServerMessage(
                    heartbeat=pb.Heartbeat(seq=session.heartbeat_seq, ack_seq=message.heartbeat.seq)
                )
                asyncio.get_running_loop().call_later(
                    self.gw.answer_delay, session.outbox.put_nowait, answer
                )

    async def _heartbeats(self, session: Session) -> None:
        gw = self.gw
        while True:
            await asyncio.sleep(gw.heartbeat_interval)
            if gw.silent or not gw.send_heartbeats:
                continue
            session.heartbeat_seq += 1
            received = [m.heartbeat.seq for m in session.received if m.HasField("heartbeat")]
            sent_at = Timestamp()
            sent_at.GetCurrentTime()
            session.outbox.put_nowait(
                pb.ServerMessage(
                    heartbeat=pb.Heartbeat(
                        seq=session.heartbeat_seq,
                        sent_at=sent_at,
                        ack_seq=max(received, default=0),
                    )
                )
            )


@pytest.fixture
def gateway() -> Iterator[FakeGateway]:
    """A started TLS fake gateway (self-signed CA, auto-ack, 15 s heartbeats)."""
    with FakeGateway(tls=True) as gw:
        yield gw


@pytest.fixture
def plain_gateway() -> Iterator[FakeGateway]:
    """A started plaintext fake gateway on 127.0.0.1."""
    with FakeGateway(tls=False) as gw:
        yield gw
