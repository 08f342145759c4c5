"""The one module of endpointd that touches protobuf: the device protocol's messages in and out.

Inbound, a ServerMessage becomes plain data (:mod:`superagent_shared.messages`): a Command
with its ``op``, an Ack, a Challenge, a Heartbeat. Outbound, every DeviceMessage is built
here from plain data and travels on as :data:`Outgoing`, which nothing else looks into.
Both directions convert with the protocol's one converter (:mod:`superagent_proto.convert`,
by field name), so a new command kind needs nothing here. The gRPC stubs are wrapped here
too (:func:`open_stream`, :func:`pair`), so the rest of endpointd, the policy engine first,
works on dataclasses and never on generated code; a layering test
(tests/repo/test_protobuf_boundary.py) keeps it so.

What this module must not do is judge: it converts field for field, keeping proto3's
distinctions (an unset ``optional`` field is None, not a zero; an empty ``kind`` oneof is a
Command without ``op``), and leaves every refusal to validation and the policy.

Nor may one message it cannot convert end the stream (a stream that ends is opened again
and meets the same message, for ever): a server message it cannot read arrives as
:class:`Undecodable` (the Command's id and why), for the daemon to refuse alone; a message
the device sends whose text is not UTF-8 (a path on disk with a byte that is not, which
Python carries as a lone surrogate and protobuf refuses) is sent with those bytes written
as ``\\xNN`` escapes (:func:`send`).

gRPC itself is imported only by the calls that need it: `endpointd status` reads the
journal through this module and should not pay for loading it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeAlias

from google.protobuf.timestamp_pb2 import Timestamp

from superagent_proto import convert
from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_shared.messages import (
    UNKNOWN,
    Accepted,
    Ack,
    AwaitingApproval,
    Challenge,
    Command,
    Finished,
    Harness,
    Heartbeat,
    Hello,
    InFlight,
    OutputChunk,
    PairRequest,
    PairResponse,
    Refused,
    Repository,
    RepositoryReport,
    Result,
    ServerMessage,
    Unknown,
)

if TYPE_CHECKING:
    import grpc

__all__ = [
    "Inbound",
    "Outgoing",
    "Sent",
    "Stream",
    "Undecodable",
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
    "send",
    "server_message",
    "time_text",
]

# A DeviceMessage on its way to the server. Built only here; everyone else passes it on.
Outgoing: TypeAlias = pb.DeviceMessage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Undecodable:
    """A server message this daemon could not convert: the Command's id (empty when it was
    not a Command, or had none) and why. Never the stream's end: the daemon refuses that one
    command."""

    command_id: str
    error: str
    KIND = "undecodable"


# What the server sends, as plain data; Unknown for a kind this daemon predates.
Inbound = ServerMessage | Undecodable
# What the device sends, as plain data.
Sent = Hello | Heartbeat | Accepted | OutputChunk | Result | AwaitingApproval | RepositoryReport

_SERVER_KINDS = convert.by_kind(Challenge, Heartbeat, Command, Ack)
_RESULT_KINDS = convert.by_kind(Finished, Refused)


# ---------------------------------------------------------------------------- inbound


def command(message: pb.Command) -> Command:
    """The plain Command, with ``body`` its deterministic serialization."""
    plain = convert.from_message(message, Command)
    ts = message.not_after
    # The zero time means "no deadline" as well as an unset one.
    not_after = plain.not_after if ts.seconds != 0 or ts.nanos != 0 else None
    return replace(plain, not_after=not_after, body=message.SerializeToString(deterministic=True))


def decode_command(body: bytes) -> Command:
    """A journaled Command (its ``body``) back as plain data."""
    return command(pb.Command.FromString(body))


def server_message(message: pb.ServerMessage) -> Inbound:
    try:
        if message.WhichOneof("msg") == "command":
            return command(message.command)  # with its body, which the generic reading lacks
        plain = convert.open_envelope(message, _SERVER_KINDS)
    except Exception as exc:  # one unreadable message is that message's failure alone
        which = message.WhichOneof("msg")
        command_id = message.command.command_id if which == "command" else ""
        return Undecodable(
            command_id, f"{which or 'an empty'} message: {type(exc).__name__}: {exc}"
        )
    return UNKNOWN if plain is None else plain


def kind_of(message: Inbound | Outgoing) -> str | None:
    """The envelope's name of ``message`` ("command", "finished", …), for logs and errors."""
    if isinstance(message, pb.DeviceMessage):
        return message.WhichOneof("msg")
    return message.KIND


# ---------------------------------------------------------------------------- outbound


def send(message: Sent) -> Outgoing:
    """``message`` in its DeviceMessage envelope; text that is not UTF-8 with its odd bytes
    written as ``\\xNN`` (see the module doc), so that it can always be sent."""
    try:
        return convert.to_envelope(message, pb.DeviceMessage)
    except (UnicodeError, ValueError) as exc:
        log.warning("a %s holds text that is not UTF-8 (%s); sending it escaped", message.KIND, exc)
        return convert.to_envelope(_utf8(message), pb.DeviceMessage)


def utf8_text(text: str) -> str:
    """``text`` as valid UTF-8: the lone surrogates Python uses for bytes that are not UTF-8
    (``os.fsdecode``) written as ``\\xNN``, any other lone surrogate as ``\\uDXXX``."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def _utf8(value: Any) -> Any:
    """``value`` (a message's plain data) with every string made valid UTF-8."""
    if isinstance(value, str):
        return utf8_text(value)
    if isinstance(value, tuple | list):
        return type(value)(_utf8(v) for v in value)
    if isinstance(value, dict):
        return {_utf8(k): _utf8(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {
            f.name: _utf8(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init
        }
        return replace(value, **changes)
    return value


def time_text(seconds: float | None = None) -> str:
    """Now (or ``seconds``) as the protocol writes a Timestamp in JSON (RFC 3339, UTC)."""
    ts = Timestamp()
    ts.FromNanoseconds(int((time.time() if seconds is None else seconds) * 1e9))
    return ts.ToJsonString()


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
    return send(
        Hello(
            device_id=device_id,
            daemon_version=daemon_version,
            protocol_version=protocol_version,
            signature=signature,
            in_flight=tuple(in_flight),
            policy_hash=policy_hash,
            sandbox=sandbox,
            min_protocol_version=min_protocol_version,
            max_protocol_version=max_protocol_version,
        )
    )


def heartbeat(seq: int, ack_seq: int) -> Outgoing:
    """Heartbeat ``seq``, sent now, acknowledging the peer's ``ack_seq``."""
    return send(Heartbeat(seq=seq, sent_at=time.time(), ack_seq=ack_seq))


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
    return send(
        RepositoryReport(
            repositories=tuple(found),
            truncated=truncated,
            scanned_at=scanned_at,
            harnesses=tuple(harnesses),
            default_harness=default_harness,
        )
    )


def accepted(command_id: str) -> Outgoing:
    return send(Accepted(command_id=command_id))


def awaiting_approval(command_id: str, rule: str, deadline: float) -> Outgoing:
    return send(AwaitingApproval(command_id=command_id, rule=rule, deadline=deadline))


def output(command_id: str, stream: int, offset: int, data: bytes) -> Outgoing:
    """An OutputChunk; ``stream`` is the spool's number, which is the protocol's."""
    return send(OutputChunk(command_id=command_id, stream=stream, offset=offset, data=data))


def result(answer: Result) -> Outgoing:
    """The Finished or Refused message of ``answer``."""
    return send(answer)


def encode_result(answer: Result) -> bytes:
    """``answer`` as the journal keeps it: its DeviceMessage, serialized."""
    return result(answer).SerializeToString()


def decode_result(data: bytes) -> Result:
    """A journaled result (:func:`encode_result`) back as plain data."""
    answer = convert.open_envelope(pb.DeviceMessage.FromString(data), _RESULT_KINDS)
    return Finished() if answer is None else answer


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

    request = PairRequest(
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
    response = endpoint_pb2_grpc.EndpointGatewayStub(channel).Pair(
        convert.to_message(request, pb.PairRequest), timeout=timeout
    )
    return convert.from_message(response, PairResponse)
