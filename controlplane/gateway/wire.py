"""The one module of the control plane that touches protobuf: the device protocol in and out.

Inbound, every DeviceMessage a device sends becomes plain data
(:mod:`superagent_shared.messages`) in :func:`read`, and a PairRequest in
:class:`Servicer`. Outbound, every ServerMessage is built here from plain values and
travels on as :data:`Outgoing`, which nothing else looks into. Both directions convert with
the protocol's one converter (:mod:`superagent_proto.convert`, by field name), so a new
command kind needs nothing here. The generated servicer and its registration live here too
(:class:`Servicer`, :func:`add_to_server`), so ``server`` and ``stream`` work on
dataclasses and grpc's own context only; a layering test (tests/repo/test_protobuf_boundary.py)
keeps it so.

What this module must not do is judge: it converts field for field, keeping proto3's
distinctions (an unset Timestamp is None, an empty or unknown ``msg`` oneof is
:data:`~superagent_shared.messages.UNKNOWN`), and leaves every refusal to the stream and
pairing. It runs for every message of every device: each conversion is one dataclass and
no copy of output.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine
from datetime import datetime
from typing import TypeAlias

import grpc
from google.protobuf.message import DecodeError

from superagent_proto import convert
from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_proto.v1 import endpoint_pb2_grpc
from superagent_shared.messages import (
    UNKNOWN,
    Accepted,
    Ack,
    AwaitingApproval,
    Challenge,
    Command,
    DeviceMessage,
    Exec,
    Finished,
    Heartbeat,
    Hello,
    Op,
    OutputChunk,
    PairRequest,
    PairResponse,
    Refused,
    RepositoryReport,
)

__all__ = [
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
    "send",
]

# A ServerMessage on its way to a device. Built only here; everyone else passes it on.
Outgoing: TypeAlias = pb.ServerMessage

_DEVICE_KINDS = convert.by_kind(
    Hello, Heartbeat, Accepted, OutputChunk, Finished, Refused, AwaitingApproval, RepositoryReport
)


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
    plain = convert.open_envelope(message, _DEVICE_KINDS)
    return UNKNOWN if plain is None else plain


# ---------------------------------------------------------------------------- outbound


def send(message: Challenge | Heartbeat | Command | Ack) -> Outgoing:
    """``message`` in its ServerMessage envelope."""
    return convert.to_envelope(message, pb.ServerMessage)


def encoded_size(message: Outgoing) -> int:
    """The bytes ``message`` takes on the wire: what a device's receive limit is about."""
    return message.ByteSize()


def challenge(
    *,
    nonce: bytes,
    server_time: datetime,
    min_protocol_version: int,
    max_protocol_version: int,
    server_version: str,
    heartbeat_interval_seconds: int,
) -> Outgoing:
    return send(
        Challenge(
            nonce=nonce,
            server_time=server_time.timestamp(),
            protocol_version=min_protocol_version,
            max_protocol_version=max_protocol_version,
            server_version=server_version,
            heartbeat_interval_seconds=heartbeat_interval_seconds,
        )
    )


def heartbeat(*, seq: int, ack_seq: int) -> Outgoing:
    """Heartbeat ``seq``, sent now, acknowledging the device's ``ack_seq``."""
    return send(Heartbeat(seq=seq, sent_at=time.time(), ack_seq=ack_seq))


def ack(command_id: str, acked_output_offset: int, *, finished: bool) -> Outgoing:
    return send(
        Ack(command_id=command_id, acked_output_offset=acked_output_offset, finished=finished)
    )


def command_message(
    *, command_id: str, seq: int, not_after: datetime, origin: str, spec: Op, ticket_id: str = ""
) -> Outgoing:
    """The command ``spec`` as the device receives it. An exec's credentials, stored with
    it (``Exec.credentials``), travel in ``Command.credentials``; ``ticket_id`` (the ticket
    it serves) confines it on the device to that ticket's workspace."""
    return send(
        Command(
            command_id=command_id,
            seq=seq,
            not_after=not_after.timestamp(),
            credentials=tuple(spec.credentials) if isinstance(spec, Exec) else (),
            origin=origin,
            ticket_id=ticket_id,
            op=spec,
        )
    )


# ---------------------------------------------------------------------------- the service


class Servicer(endpoint_pb2_grpc.EndpointGatewayServicer):
    """The generated servicer, speaking plain data to its subclass.

    A subclass (``server.EndpointGateway``) implements :meth:`pair` and :meth:`connect`;
    the generated ``Pair`` and ``Connect`` that gRPC calls convert around them.
    """

    async def Pair(
        self, request: pb.PairRequest, context: grpc.aio.ServicerContext
    ) -> pb.PairResponse:
        answer = await self.pair(convert.from_message(request, PairRequest), context)
        return convert.to_message(answer, pb.PairResponse)

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
