"""The one module that touches protobuf: the device protocol's messages in and out.

Inbound, a ServerMessage becomes plain data (:mod:`endpointd.model`): a Command with its
``op``, an Ack, a Challenge, a Heartbeat. Outbound, every DeviceMessage is built here from
plain values and travels on as :data:`Outgoing`, which nothing else looks into. The gRPC
stubs are wrapped here too (:func:`open_stream`, :func:`pair`), so the rest of endpointd,
the policy engine first, works on dataclasses and never on generated code; a layering test
(tests/test_protobuf_boundary.py) keeps it so.

What this module must not do is judge: it converts field for field, keeping proto3's
distinctions (an unset ``optional`` field is None, not a zero; an empty ``kind`` oneof is a
Command without ``op``), and leaves every refusal to validation and the policy.

gRPC itself is imported only by the calls that need it: `endpointd status` reads the
journal through this module and should not pay for loading it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from endpointd.model import (
    Ack,
    Cancel,
    Challenge,
    Command,
    CredentialRef,
    Delivery,
    Exec,
    Finished,
    Glob,
    Harness,
    Heartbeat,
    InFlight,
    InFlightState,
    ListDir,
    Op,
    PairResponse,
    PrepareWorkspace,
    ReadFile,
    Reason,
    Refused,
    ReleaseWorkspace,
    Repository,
    Result,
    RunHarness,
    Search,
    WorkspaceBase,
    WriteFile,
)
from superagent_proto.v1 import endpoint_pb2 as pb

if TYPE_CHECKING:
    import grpc

__all__ = [
    "Inbound",
    "Outgoing",
    "Stream",
    "Unknown",
    "accepted",
    "awaiting_approval",
    "command",
    "decode_command",
    "decode_result",
    "encode_result",
    "heartbeat",
    "hello",
    "kind_of",
    "open_stream",
    "output",
    "pair",
    "repositories",
    "result",
    "server_message",
    "time_text",
]

# A DeviceMessage on its way to the server. Built only here; everyone else passes it on.
Outgoing: TypeAlias = pb.DeviceMessage


@dataclass(slots=True, frozen=True)
class Unknown:
    """A ServerMessage of a kind this daemon predates (an empty envelope to it)."""


Inbound = Challenge | Heartbeat | Command | Ack | Unknown

_INBOUND_KIND: dict[type[Inbound], str] = {
    Challenge: "challenge",
    Heartbeat: "heartbeat",
    Command: "command",
    Ack: "ack",
}

_IN_FLIGHT: dict[InFlightState, pb.InFlight.State.ValueType] = {
    "accepted": pb.InFlight.STATE_ACCEPTED,
    "awaiting_approval": pb.InFlight.STATE_AWAITING_APPROVAL,
    "running": pb.InFlight.STATE_RUNNING,
    "finished": pb.InFlight.STATE_FINISHED,
}


# ---------------------------------------------------------------------------- inbound


def _seconds(ts: Timestamp) -> float:
    return ts.seconds + ts.nanos / 1e9


def _delivery(value: int) -> Delivery | int:
    try:
        return Delivery(value)
    except ValueError:
        return value


def _workspace_base(value: int) -> WorkspaceBase | int:
    try:
        return WorkspaceBase(value)
    except ValueError:
        return value


def _op(message: pb.Command) -> Op | None:
    kind = message.WhichOneof("kind")
    if kind == "exec":
        ex = message.exec
        return Exec(
            argv=tuple(ex.argv),
            cwd=ex.cwd,
            env=dict(ex.env),
            timeout_seconds=ex.timeout_seconds,
            stdin=ex.stdin if ex.HasField("stdin") else None,
        )
    if kind == "read_file":
        rf = message.read_file
        return ReadFile(
            path=rf.path, offset=rf.offset, limit=rf.limit if rf.HasField("limit") else None
        )
    if kind == "write_file":
        wf = message.write_file
        return WriteFile(
            path=wf.path,
            content=wf.content,
            mode=wf.mode if wf.HasField("mode") else None,
            create_parents=wf.create_parents,
            expected_sha256=wf.expected_sha256 if wf.HasField("expected_sha256") else None,
        )
    if kind == "list_dir":
        return ListDir(path=message.list_dir.path, depth=message.list_dir.depth)
    if kind == "cancel":
        return Cancel(
            target_command_id=message.cancel.target_command_id,
            grace_seconds=message.cancel.grace_seconds,
        )
    if kind == "prepare_workspace":
        pw = message.prepare_workspace
        return PrepareWorkspace(
            ticket_id=pw.ticket_id,
            repo=pw.repo,
            base=_workspace_base(pw.base),
            ref=pw.ref,
            path=pw.path,
            setup=pw.setup,
        )
    if kind == "release_workspace":
        return ReleaseWorkspace(ticket_id=message.release_workspace.ticket_id)
    if kind == "search":
        se = message.search
        return Search(
            pattern=se.pattern,
            path=se.path,
            glob=se.glob,
            literal=se.literal,
            ignore_case=se.ignore_case,
            max_matches=se.max_matches,
        )
    if kind == "glob":
        gl = message.glob
        return Glob(pattern=gl.pattern, path=gl.path, max_entries=gl.max_entries)
    if kind == "run_harness":
        rh = message.run_harness
        return RunHarness(
            harness=rh.harness,
            cwd=rh.cwd,
            prompt=rh.prompt,
            resume_session=rh.resume_session,
            max_turns=rh.max_turns,
            timeout_seconds=rh.timeout_seconds,
        )
    return None  # a kind newer than this daemon: validation refuses it as unknown


def command(message: pb.Command) -> Command:
    """The plain Command, with ``body`` its deterministic serialization."""
    not_after: float | None = None
    if message.HasField("not_after"):
        ts = message.not_after
        if ts.seconds != 0 or ts.nanos != 0:  # the zero time means "no deadline" as well
            not_after = _seconds(ts)
    return Command(
        command_id=message.command_id,
        seq=message.seq,
        op=_op(message),
        credentials=tuple(
            CredentialRef(name=ref.name, delivery=_delivery(ref.delivery), env_var=ref.env_var)
            for ref in message.credentials
        ),
        origin=message.origin,
        not_after=not_after,
        body=message.SerializeToString(deterministic=True),
    )


def decode_command(body: bytes) -> Command:
    """A journaled Command (its ``body``) back as plain data."""
    return command(pb.Command.FromString(body))


def server_message(message: pb.ServerMessage) -> Inbound:
    kind = message.WhichOneof("msg")
    if kind == "command":
        return command(message.command)
    if kind == "ack":
        ack = message.ack
        return Ack(
            command_id=ack.command_id,
            acked_output_offset=ack.acked_output_offset,
            finished=ack.finished,
        )
    if kind == "heartbeat":
        return Heartbeat(seq=message.heartbeat.seq)
    if kind == "challenge":
        challenge = message.challenge
        return Challenge(
            nonce=challenge.nonce,
            server_time=(
                challenge.server_time.ToNanoseconds() / 1e9
                if challenge.HasField("server_time")
                else None
            ),
            protocol_version=challenge.protocol_version,
            heartbeat_interval_seconds=challenge.heartbeat_interval_seconds,
            max_protocol_version=challenge.max_protocol_version,
            server_version=challenge.server_version,
        )
    return Unknown()


def kind_of(message: Inbound | Outgoing) -> str | None:
    """The envelope's name of ``message`` ("command", "finished", …), for logs and errors."""
    if isinstance(message, pb.DeviceMessage):
        return message.WhichOneof("msg")
    return _INBOUND_KIND.get(type(message))


# ---------------------------------------------------------------------------- outbound


def _timestamp(seconds: float | None = None) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int((time.time() if seconds is None else seconds) * 1e9))
    return ts


def time_text(seconds: float | None = None) -> str:
    """Now (or ``seconds``) as the protocol writes a Timestamp in JSON (RFC 3339, UTC)."""
    return _timestamp(seconds).ToJsonString()


def hello(
    *,
    device_id: str,
    daemon_version: str,
    protocol_version: int,
    signature: bytes,
    in_flight: Sequence[InFlight],
    policy_hash: bytes,
    sandbox: str,
    min_protocol_version: int,
    max_protocol_version: int,
) -> Outgoing:
    return pb.DeviceMessage(
        hello=pb.Hello(
            device_id=device_id,
            daemon_version=daemon_version,
            protocol_version=protocol_version,
            min_protocol_version=min_protocol_version,
            max_protocol_version=max_protocol_version,
            signature=signature,
            in_flight=[
                pb.InFlight(
                    command_id=item.command_id,
                    acked_output_offset=item.acked_output_offset,
                    state=_IN_FLIGHT[item.state],
                )
                for item in in_flight
            ],
            policy_hash=policy_hash,
            sandbox=sandbox,
        )
    )


def heartbeat(seq: int, ack_seq: int) -> Outgoing:
    """Heartbeat ``seq``, sent now, acknowledging the peer's ``ack_seq``."""
    return pb.DeviceMessage(heartbeat=pb.Heartbeat(seq=seq, sent_at=_timestamp(), ack_seq=ack_seq))


def repositories(
    found: Sequence[Repository],
    *,
    truncated: bool,
    scanned_at: float,
    harnesses: Sequence[Harness] = (),
    default_harness: str = "",
) -> Outgoing:
    """The repositories found under the allowed roots, and the coding-agent CLIs installed
    here with the policy's default among them (each report replaces the last)."""
    return pb.DeviceMessage(
        repositories=pb.RepositoryReport(
            repositories=[
                pb.Repository(path=r.path, remote=r.remote, default_branch=r.default_branch)
                for r in found
            ],
            truncated=truncated,
            scanned_at=_timestamp(scanned_at),
            harnesses=[
                pb.Harness(name=h.name, version=h.version, allowed=h.allowed, logged_in=h.logged_in)
                for h in harnesses
            ],
            default_harness=default_harness,
        )
    )


def accepted(command_id: str) -> Outgoing:
    return pb.DeviceMessage(accepted=pb.Accepted(command_id=command_id))


def awaiting_approval(command_id: str, rule: str, deadline: float) -> Outgoing:
    return pb.DeviceMessage(
        awaiting_approval=pb.AwaitingApproval(
            command_id=command_id, rule=rule, deadline=_timestamp(deadline)
        )
    )


def output(command_id: str, stream: int, offset: int, data: bytes) -> Outgoing:
    """An OutputChunk; ``stream`` is the spool's number, which is the protocol's."""
    return pb.DeviceMessage(
        output=pb.OutputChunk(
            command_id=command_id,
            stream=pb.OutputChunk.Stream.ValueType(stream),
            offset=offset,
            data=data,
        )
    )


def result(answer: Result) -> Outgoing:
    """The Finished or Refused message of ``answer``."""
    if isinstance(answer, Refused):
        return pb.DeviceMessage(
            refused=pb.Refused(
                command_id=answer.command_id,
                reason=pb.Refused.Reason.ValueType(answer.reason),
                message=answer.message,
            )
        )
    duration = Duration()
    duration.FromNanoseconds(answer.duration_ns)
    return pb.DeviceMessage(
        finished=pb.Finished(
            command_id=answer.command_id,
            exit_code=answer.exit_code,
            signal=answer.signal,
            error=answer.error,
            total_output_bytes=answer.total_output_bytes,
            duration=duration,
            timed_out=answer.timed_out,
            output_truncated=answer.output_truncated,
        )
    )


def encode_result(answer: Result) -> bytes:
    """``answer`` as the journal keeps it: its DeviceMessage, serialized."""
    return result(answer).SerializeToString()


def decode_result(data: bytes) -> Result:
    """A journaled result (:func:`encode_result`) back as plain data."""
    message = pb.DeviceMessage.FromString(data)
    if message.HasField("refused"):
        refused = message.refused
        return Refused(
            command_id=refused.command_id, reason=Reason(refused.reason), message=refused.message
        )
    f = message.finished
    return Finished(
        command_id=f.command_id,
        exit_code=f.exit_code,
        signal=f.signal,
        error=f.error,
        total_output_bytes=f.total_output_bytes,
        duration_ns=f.duration.ToNanoseconds(),
        timed_out=f.timed_out,
        output_truncated=f.output_truncated,
    )


# ---------------------------------------------------------------------------- calls


class Stream:
    """One Connect call: ServerMessages in, as plain data, and DeviceMessages out."""

    def __init__(self, call: Any) -> None:
        import grpc

        self._call = call
        self._eof = grpc.aio.EOF

    async def read(self) -> Inbound | None:
        """The next server message; None once the server has ended the stream."""
        message = await self._call.read()
        if message is self._eof:
            return None
        return server_message(message)

    async def write(self, message: Outgoing) -> None:
        await self._call.write(message)

    async def code(self) -> grpc.StatusCode:
        return await self._call.code()

    async def details(self) -> str:
        details: str = await self._call.details()
        return details

    def cancel(self) -> None:
        self._call.cancel()


def open_stream(channel: grpc.aio.Channel) -> Stream:
    """Call Connect on ``channel``."""
    from superagent_proto.v1 import endpoint_pb2_grpc

    return Stream(endpoint_pb2_grpc.EndpointGatewayStub(channel).Connect())


def pair(
    channel: grpc.Channel,
    *,
    pairing_code: str,
    device_name: str,
    public_key: bytes,
    daemon_version: str,
    min_protocol_version: int,
    max_protocol_version: int,
    platform: str,
    hostname: str,
    timeout: float,
) -> PairResponse:
    """Call Pair on ``channel``; a refusal raises grpc.RpcError."""
    from superagent_proto.v1 import endpoint_pb2_grpc

    request = pb.PairRequest(
        pairing_code=pairing_code,
        device_name=device_name,
        public_key=public_key,
        daemon_version=daemon_version,
        # The lowest in the older field: servers that predate the range accept only an
        # exact match there, so a daemon that still speaks their version can pair.
        protocol_version=min_protocol_version,
        max_protocol_version=max_protocol_version,
        platform=platform,
        hostname=hostname,
    )
    response = endpoint_pb2_grpc.EndpointGatewayStub(channel).Pair(request, timeout=timeout)
    return PairResponse(
        device_id=response.device_id,
        server_cert_sha256=response.server_cert_sha256,
        server_name=response.server_name,
        server_ca_pem=response.server_ca_pem,
        server_version=response.server_version,
    )
