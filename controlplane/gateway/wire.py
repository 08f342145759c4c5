"""The one module of the control plane that touches protobuf: the device protocol in and out.

Inbound, every DeviceMessage a device sends becomes plain data (:mod:`.messages`) in
:func:`read`, and a PairRequest in :class:`Servicer`. Outbound, every ServerMessage is
built here from plain values and travels on as :data:`Outgoing`, which nothing else looks
into. The generated servicer and its registration live here too (:class:`Servicer`,
:func:`add_to_server`), so ``server`` and ``stream`` work on dataclasses and grpc's own
context only; a layering test (tests/test_protobuf_boundary.py) keeps it so.

What this module must not do is judge: it converts field for field, keeping proto3's
distinctions (an unset Timestamp is None, an empty or unknown ``msg`` oneof is
:data:`.messages.UNKNOWN`), and leaves every refusal to the stream and pairing. It runs for
every message of every device, so each conversion is one dataclass and no copy of output.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import TypeAlias

import grpc
from google.protobuf.message import DecodeError
from google.protobuf.timestamp_pb2 import Timestamp

from controlplane.gateway import specs
from controlplane.gateway.messages import (
    UNKNOWN,
    Accepted,
    AwaitingApproval,
    DeviceMessage,
    Finished,
    Harness,
    Heartbeat,
    Hello,
    InFlight,
    InFlightState,
    OutputChunk,
    PairRequest,
    PairResponse,
    Refused,
    Repository,
    RepositoryReport,
)
from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_proto.v1 import endpoint_pb2_grpc

__all__ = [
    "REFUSAL_REASONS",
    "Outgoing",
    "Servicer",
    "Undecodable",
    "ack",
    "add_to_server",
    "challenge",
    "command_message",
    "device_message",
    "heartbeat",
    "read",
    "timestamp",
    "timestamp_now",
]

# A ServerMessage on its way to a device. Built only here; everyone else passes it on.
Outgoing: TypeAlias = pb.ServerMessage

_DELIVERY = {
    "env": pb.CredentialRef.DELIVERY_ENV,
    "file": pb.CredentialRef.DELIVERY_FILE,
    "git_helper": pb.CredentialRef.DELIVERY_GIT_HELPER,
    # The value never reaches the command: the device's proxy adds it to HTTPS requests for
    # the credential's hosts (its local policy); env_var is unused.
    "http": pb.CredentialRef.DELIVERY_HTTP,
}

_WORKSPACE_BASE = {
    "default_branch": pb.PrepareWorkspace.BASE_DEFAULT_BRANCH,
    "pull_request": pb.PrepareWorkspace.BASE_PULL_REQUEST,
    "local_changes": pb.PrepareWorkspace.BASE_LOCAL_CHANGES,
}

REFUSAL_REASONS = {
    value.number: value.name.removeprefix("REASON_").lower()
    for value in pb.Refused.Reason.DESCRIPTOR.values
}

_IN_FLIGHT: dict[int, InFlightState] = {
    pb.InFlight.STATE_ACCEPTED: "accepted",
    pb.InFlight.STATE_AWAITING_APPROVAL: "awaiting_approval",
    pb.InFlight.STATE_RUNNING: "running",
    pb.InFlight.STATE_FINISHED: "finished",
}


# ---------------------------------------------------------------------------- inbound


class Undecodable(Exception):
    """What a device sent on its stream does not parse as a DeviceMessage."""


async def read(context: grpc.aio.ServicerContext) -> DeviceMessage | None:
    """The next message on a Connect stream (its servicer ``context``); None at its end.

    A coroutine of its own rather than a wrapper object per stream: an idle stream waits
    in here, and a replica holds thousands of them (bench/RESULTS.md, idle fleet).
    """
    try:
        message = await context.read()
    except DecodeError:
        raise Undecodable from None
    if message is grpc.aio.EOF:
        return None
    return device_message(message)


def device_message(message: pb.DeviceMessage) -> DeviceMessage:
    kind = message.WhichOneof("msg")
    # The common kinds first: heartbeats from every device, output from busy ones.
    if kind == "heartbeat":
        return Heartbeat(seq=message.heartbeat.seq)
    if kind == "output":
        chunk = message.output
        return OutputChunk(command_id=chunk.command_id, offset=chunk.offset, data=chunk.data)
    if kind == "accepted":
        return Accepted(command_id=message.accepted.command_id)
    if kind == "finished":
        f = message.finished
        return Finished(
            command_id=f.command_id,
            exit_code=f.exit_code,
            signal=f.signal,
            error=f.error,
            total_output_bytes=f.total_output_bytes,
            timed_out=f.timed_out,
            output_truncated=f.output_truncated,
        )
    if kind == "refused":
        refused = message.refused
        return Refused(
            command_id=refused.command_id,
            reason=REFUSAL_REASONS.get(refused.reason, "unspecified"),
            message=refused.message,
        )
    if kind == "awaiting_approval":
        waiting = message.awaiting_approval
        return AwaitingApproval(
            command_id=waiting.command_id, rule=waiting.rule, deadline=_deadline(waiting)
        )
    if kind == "hello":
        return _hello(message.hello)
    if kind == "repositories":
        report = message.repositories
        return RepositoryReport(
            repositories=tuple(
                Repository(path=r.path, remote=r.remote, default_branch=r.default_branch)
                for r in report.repositories
            ),
            truncated=report.truncated,
            scanned_at=_time(report.scanned_at) if report.HasField("scanned_at") else None,
            harnesses=tuple(
                Harness(name=h.name, version=h.version, allowed=h.allowed, logged_in=h.logged_in)
                for h in report.harnesses
            ),
            default_harness=report.default_harness,
        )
    return UNKNOWN


def _hello(hello: pb.Hello) -> Hello:
    return Hello(
        device_id=hello.device_id,
        daemon_version=hello.daemon_version,
        protocol_version=hello.protocol_version,
        signature=hello.signature,
        in_flight=tuple(
            InFlight(
                command_id=item.command_id,
                acked_output_offset=item.acked_output_offset,
                state=_IN_FLIGHT.get(item.state, "unspecified"),
            )
            for item in hello.in_flight
        ),
        policy_hash=hello.policy_hash,
        sandbox=hello.sandbox,
        min_protocol_version=hello.min_protocol_version,
        max_protocol_version=hello.max_protocol_version,
    )


def _deadline(waiting: pb.AwaitingApproval) -> datetime | None:
    """The device's deadline, or None if unset or not a representable time."""
    if not waiting.HasField("deadline"):
        return None
    return _time(waiting.deadline)


def _time(stamp: Timestamp) -> datetime | None:
    """A device's point in time, or None if not a representable (positive) one."""
    if stamp.seconds <= 0:
        return None
    try:
        return stamp.ToDatetime(tzinfo=UTC)
    except (ValueError, OverflowError, OSError):
        return None


# ---------------------------------------------------------------------------- outbound


def timestamp(when: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(when)
    return stamp


def timestamp_now() -> Timestamp:
    """The current time; for every heartbeat, so cheaper than ``timestamp(datetime.now())``."""
    ns = time.time_ns()
    return Timestamp(seconds=ns // 1_000_000_000, nanos=ns % 1_000_000_000)


def challenge(
    *,
    nonce: bytes,
    server_time: datetime,
    min_protocol_version: int,
    max_protocol_version: int,
    server_version: str,
    heartbeat_interval_seconds: int,
) -> Outgoing:
    return pb.ServerMessage(
        challenge=pb.Challenge(
            nonce=nonce,
            server_time=timestamp(server_time),
            protocol_version=min_protocol_version,
            max_protocol_version=max_protocol_version,
            server_version=server_version,
            heartbeat_interval_seconds=heartbeat_interval_seconds,
        )
    )


def heartbeat(*, seq: int, ack_seq: int) -> Outgoing:
    """Heartbeat ``seq``, sent now, acknowledging the device's ``ack_seq``."""
    return pb.ServerMessage(
        heartbeat=pb.Heartbeat(seq=seq, sent_at=timestamp_now(), ack_seq=ack_seq)
    )


def ack(command_id: str, acked_output_offset: int, *, finished: bool) -> Outgoing:
    return pb.ServerMessage(
        ack=pb.Ack(
            command_id=command_id, acked_output_offset=acked_output_offset, finished=finished
        )
    )


def command_message(
    *, command_id: str, seq: int, not_after: datetime, origin: str, spec: specs.Spec
) -> Outgoing:
    command = pb.Command(
        command_id=command_id, seq=seq, not_after=timestamp(not_after), origin=origin
    )
    if isinstance(spec, specs.Exec):
        command.exec.CopyFrom(
            pb.ExecCommand(
                argv=spec.argv, cwd=spec.cwd, env=spec.env, timeout_seconds=spec.timeout_seconds
            )
        )
        if spec.stdin is not None:
            command.exec.stdin = spec.stdin
        for use in spec.credentials:
            command.credentials.append(
                pb.CredentialRef(
                    name=use.name, delivery=_DELIVERY[use.delivery], env_var=use.env_var
                )
            )
    elif isinstance(spec, specs.ReadFile):
        command.read_file.CopyFrom(pb.ReadFile(path=spec.path, offset=spec.offset))
        if spec.limit is not None:
            command.read_file.limit = spec.limit
    elif isinstance(spec, specs.WriteFile):
        command.write_file.CopyFrom(
            pb.WriteFile(path=spec.path, content=spec.content, create_parents=spec.create_parents)
        )
        if spec.mode is not None:
            command.write_file.mode = spec.mode
        if spec.expected_sha256 is not None:
            command.write_file.expected_sha256 = spec.expected_sha256
    elif isinstance(spec, specs.ListDir):
        command.list_dir.CopyFrom(pb.ListDir(path=spec.path, depth=spec.depth))
    elif isinstance(spec, specs.PrepareWorkspace):
        command.prepare_workspace.CopyFrom(
            pb.PrepareWorkspace(
                ticket_id=spec.ticket_id,
                repo=spec.repo,
                base=_WORKSPACE_BASE[spec.base],
                ref=spec.ref,
                path=spec.path,
                setup=spec.setup,
            )
        )
    elif isinstance(spec, specs.ReleaseWorkspace):
        command.release_workspace.CopyFrom(pb.ReleaseWorkspace(ticket_id=spec.ticket_id))
    elif isinstance(spec, specs.Search):
        command.search.CopyFrom(
            pb.Search(
                pattern=spec.pattern,
                path=spec.path,
                glob=spec.glob,
                literal=spec.literal,
                ignore_case=spec.ignore_case,
                max_matches=spec.max_matches,
            )
        )
    elif isinstance(spec, specs.Glob):
        command.glob.CopyFrom(
            pb.Glob(pattern=spec.pattern, path=spec.path, max_entries=spec.max_entries)
        )
    elif isinstance(spec, specs.RunHarness):
        command.run_harness.CopyFrom(
            pb.RunHarness(
                harness=spec.harness,
                cwd=spec.cwd,
                prompt=spec.prompt,
                resume_session=spec.resume_session,
                max_turns=spec.max_turns,
                timeout_seconds=spec.timeout_seconds,
            )
        )
    else:
        command.cancel.CopyFrom(
            pb.CancelCommand(
                target_command_id=spec.target_command_id, grace_seconds=spec.grace_seconds
            )
        )
    return pb.ServerMessage(command=command)


# ---------------------------------------------------------------------------- the service


class Servicer(endpoint_pb2_grpc.EndpointGatewayServicer):
    """The generated servicer, speaking plain data to its subclass.

    A subclass (``server.EndpointGateway``) implements :meth:`pair` and :meth:`connect`;
    the generated ``Pair`` and ``Connect`` that gRPC calls convert around them.
    """

    async def Pair(
        self, request: pb.PairRequest, context: grpc.aio.ServicerContext
    ) -> pb.PairResponse:
        answer = await self.pair(
            PairRequest(
                pairing_code=request.pairing_code,
                device_name=request.device_name,
                public_key=request.public_key,
                daemon_version=request.daemon_version,
                protocol_version=request.protocol_version,
                platform=request.platform,
                hostname=request.hostname,
                max_protocol_version=request.max_protocol_version,
            ),
            context,
        )
        return pb.PairResponse(
            device_id=answer.device_id,
            server_cert_sha256=answer.server_cert_sha256,
            server_name=answer.server_name,
            server_ca_pem=answer.server_ca_pem,
            server_version=answer.server_version,
        )

    # A coroutine using context.read()/write() rather than an async generator: the stream
    # needs one writer task beside its reader, which the generator style cannot express.
    async def Connect(  # type: ignore[override]
        self, request_iterator: object, context: grpc.aio.ServicerContext
    ) -> None:
        await self.connect(context)

    async def pair(self, request: PairRequest, context: grpc.aio.ServicerContext) -> PairResponse:
        """Pair a device; refusals abort ``context`` (the call's servicer context)."""
        raise NotImplementedError

    def connect(self, context: grpc.aio.ServicerContext) -> Coroutine[object, object, None]:
        """What serves one Connect stream (reading with :func:`read`, writing
        :data:`Outgoing`); returned rather than awaited in a coroutine of its own, so that
        each of a replica's idle streams holds no frame more than the generated servicer's."""
        raise NotImplementedError


def add_to_server(servicer: Servicer, server: grpc.aio.Server) -> None:
    """Serve ``servicer``'s RPCs on ``server`` (a grpc.aio.Server)."""
    endpoint_pb2_grpc.add_EndpointGatewayServicer_to_server(servicer, server)
