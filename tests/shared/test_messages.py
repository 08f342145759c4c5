"""The protocol's plain messages and its ``.proto`` cannot drift apart.

Every message class of :mod:`superagent_shared.messages` has its ``.proto`` message with the
same fields, by name and kind; every command kind, envelope kind and enum value of the
``.proto`` has its class or member; and whatever one program sends, the other reads back
as the very same value, through each side's wire module (property tests: the values are
drawn from the descriptor and the annotations together, so a new field is covered without
a line here).
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.gateway import wire as server_wire
from endpointd import wire as device_wire
from superagent_proto import convert
from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_shared import messages

FILE = pb.DESCRIPTOR
# Classes named unlike their message: the protocol spells these two ``...Command``.
PROTO_NAME = {"Exec": "ExecCommand", "Cancel": "CancelCommand"}
# Dataclasses that are not a wire message: the device's own elaboration of RunHarness, and
# the stand-in for an envelope of a kind the receiver predates.
NOT_ON_THE_WIRE = {messages.HarnessExec, messages.Unknown}
# Fields the .proto does not carry, each with its reason.
PLAIN_ONLY = {
    ("Command", "body"): "endpointd's wire keeps the received bytes for the journal",
    ("Exec", "credentials"): "the control plane stores them with the exec; sent in Command",
}
ENVELOPES = {"DeviceMessage", "ServerMessage"}

FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


def _classes() -> list[type[Any]]:
    found = [
        value
        for value in vars(messages).values()
        if isinstance(value, type)
        and dataclasses.is_dataclass(value)
        and value.__module__ == messages.__name__
    ]
    return [c for c in found if c not in NOT_ON_THE_WIRE]


def _descriptor(cls: type[Any]) -> Descriptor:
    return FILE.message_types_by_name[PROTO_NAME.get(cls.__name__, cls.__name__)]


def _class_of(descriptor: Descriptor) -> type[Any]:
    (cls,) = [c for c in _classes() if _descriptor(c) is descriptor]
    return cls


CLASSES = _classes()


def _members(hint: Any) -> list[Any]:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(hint) for m in _members(arg)]
    return [hint]


# ---------------------------------------------------------------------------- the shape


def test_every_message_of_the_proto_has_its_class() -> None:
    named = {_descriptor(c).name for c in CLASSES}
    assert set(FILE.message_types_by_name) - ENVELOPES == named


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_a_class_has_its_messages_fields_by_name_and_kind(cls: type[Any]) -> None:
    descriptor = _descriptor(cls)
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls)]
    expected: list[str] = []
    for fd in descriptor.fields:
        if fd.containing_oneof is not None and not _synthetic(fd):
            continue  # a member of a real oneof: checked as its union below
        name = fd.name + "_ns" if _is(fd, "google.protobuf.Duration") else fd.name
        expected.append(name)
        assert name in hints, (
            f"{cls.__name__} has no field {name!r} for {descriptor.name}.{fd.name}"
        )
        _check_kind(fd, hints[name], f"{cls.__name__}.{name}")
    for oneof in descriptor.oneofs:
        if _synthetic(oneof.fields[0]):
            continue
        (field_name,) = [
            n for n in fields if n not in expected and (cls.__name__, n) not in PLAIN_ONLY
        ]
        kinds = {m.KIND: m for m in _members(hints[field_name]) if m is not type(None)}
        assert set(kinds) == {f.name for f in oneof.fields}, f"{cls.__name__}.{field_name}"
        for member in oneof.fields:
            assert _descriptor(kinds[member.name]) is member.message_type
        expected.append(field_name)
    extra = [n for n in fields if n not in expected]
    assert all((cls.__name__, n) in PLAIN_ONLY for n in extra), extra
    assert sorted(expected) == sorted(n for n in fields if n not in extra)


def _synthetic(fd: FieldDescriptor) -> bool:
    oneof = fd.containing_oneof
    return oneof is not None and oneof.name == "_" + fd.name


def _is(fd: FieldDescriptor, full_name: str) -> bool:
    return fd.message_type is not None and fd.message_type.full_name == full_name


_SCALARS = {
    FieldDescriptor.TYPE_STRING: str,
    FieldDescriptor.TYPE_BYTES: bytes,
    FieldDescriptor.TYPE_BOOL: bool,
    FieldDescriptor.TYPE_INT32: int,
    FieldDescriptor.TYPE_UINT32: int,
    FieldDescriptor.TYPE_UINT64: int,
    FieldDescriptor.TYPE_INT64: int,
}


def _check_kind(fd: FieldDescriptor, hint: Any, where: str) -> None:
    members = set(_members(hint))
    if _is(fd, "google.protobuf.Timestamp"):
        assert members == {float, type(None)}, where
    elif _is(fd, "google.protobuf.Duration"):
        assert members == {int}, where
    elif fd.message_type is not None and fd.message_type.GetOptions().map_entry:
        assert typing.get_origin(hint) is Mapping, where
    elif fd.message_type is not None:
        assert fd.is_repeated, f"{where}: a singular nested message"
        assert typing.get_origin(hint) in (tuple, Sequence), where
        assert typing.get_args(hint)[0] is _class_of(fd.message_type), where
    elif fd.is_repeated:
        assert typing.get_origin(hint) in (tuple, Sequence), where
        assert typing.get_args(hint)[0] is _SCALARS[fd.type], where
    elif fd.enum_type is not None:
        (kind,) = [m for m in members if isinstance(m, type) and issubclass(m, enum.IntEnum)]
        assert members == {kind, int}, f"{where}: an unknown number stays an int"
        _check_enum(kind, fd.enum_type)
    else:
        optional = fd.has_presence
        assert members == ({_SCALARS[fd.type], type(None)} if optional else {_SCALARS[fd.type]}), (
            where
        )


def _check_enum(kind: type[enum.IntEnum], descriptor: EnumDescriptor) -> None:
    names = [v.name for v in descriptor.values]
    prefix = names[0].removesuffix("UNSPECIFIED")
    assert {(prefix + m.name, m.value) for m in kind} == {
        (v.name, v.number) for v in descriptor.values
    }, kind.__name__


def test_the_unions_name_every_kind_of_the_envelopes() -> None:
    for union, envelope in (
        (messages.DeviceMessage, pb.DeviceMessage),
        (messages.ServerMessage, pb.ServerMessage),
    ):
        kinds = {m.KIND: m for m in _members(union) if m is not messages.Unknown}
        fields = envelope.DESCRIPTOR.oneofs_by_name["msg"].fields
        assert set(kinds) == {f.name for f in fields}, envelope.DESCRIPTOR.name
        for f in fields:
            assert _descriptor(kinds[f.name]) is f.message_type


# ---------------------------------------------------------------------------- round trips

_INTS = {
    FieldDescriptor.TYPE_INT32: st.integers(-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: st.integers(0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: st.integers(0, 2**64 - 1),
    FieldDescriptor.TYPE_INT64: st.integers(-(2**63), 2**63 - 1),
}
_TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
# A Timestamp's range, from its seconds and nanoseconds: float seconds as a peer sends them.
_TIME = st.builds(
    lambda s, n: s + n / 1e9, st.integers(-62135596800, 253402300799), st.integers(0, 10**9 - 1)
)


def _value(fd: FieldDescriptor, hint: Any) -> st.SearchStrategy[Any]:
    if _is(fd, "google.protobuf.Timestamp"):
        return st.none() | _TIME.filter(bool)  # a zero time reads as none on the device
    if _is(fd, "google.protobuf.Duration"):
        return st.integers(-(10**18), 10**18)
    if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
        return st.dictionaries(_TEXT, _TEXT, max_size=3)
    if fd.message_type is not None:
        nested = strategy(_class_of(fd.message_type))
        return st.lists(nested, max_size=3).map(tuple)
    if fd.is_repeated:
        return st.lists(_TEXT, max_size=3).map(tuple)
    if fd.enum_type is not None:
        (kind,) = [m for m in _members(hint) if isinstance(m, type) and issubclass(m, enum.IntEnum)]
        # A number the receiver does not know arrives as that number.
        return st.sampled_from(list(kind)) | st.integers(len(kind), 99)
    scalars: dict[int, st.SearchStrategy[Any]] = {
        FieldDescriptor.TYPE_STRING: _TEXT,
        FieldDescriptor.TYPE_BYTES: st.binary(max_size=12),
        FieldDescriptor.TYPE_BOOL: st.booleans(),
        **_INTS,
    }
    scalar = scalars[fd.type]
    return st.none() | scalar if fd.has_presence else scalar


def strategy(cls: type[Any]) -> st.SearchStrategy[Any]:
    """Any value of ``cls`` that the wire can carry."""
    descriptor = _descriptor(cls)
    hints = typing.get_type_hints(cls)
    drawn: dict[str, st.SearchStrategy[Any]] = {}
    for f in dataclasses.fields(cls):
        if (cls.__name__, f.name) in PLAIN_ONLY:
            continue
        fd = descriptor.fields_by_name.get(f.name.removesuffix("_ns"))
        if fd is not None:
            drawn[f.name] = _value(fd, hints[f.name])
        else:  # the oneof of commands; anything else is a drift the shape tests name
            ops = [m for m in _members(hints[f.name]) if hasattr(m, "KIND")]
            if ops:
                drawn[f.name] = st.none() | st.one_of([strategy(op) for op in ops])
    return st.builds(cls, **drawn)


@FUZZ
@given(
    st.one_of([strategy(c) for c in _members(messages.ServerMessage) if c is not messages.Unknown])
)
def test_what_the_control_plane_sends_the_device_reads(message: Any) -> None:
    read = device_wire.server_message(server_wire.send(message))
    assert read == message


@FUZZ
@given(
    st.one_of([strategy(c) for c in _members(messages.DeviceMessage) if c is not messages.Unknown])
)
def test_what_the_device_sends_the_control_plane_reads(message: Any) -> None:
    assert server_wire.device_message(device_wire.send(message)) == message


@FUZZ
@given(strategy(messages.Command), st.lists(strategy(messages.CredentialRef), max_size=2))
def test_a_stored_execs_credentials_reach_the_device_with_its_command(
    command: messages.Command, credentials: list[messages.CredentialRef]
) -> None:
    """The control plane keeps an exec's credentials with it; the device reads them in the
    Command, and its exec has none."""
    if command.op is None:
        return
    op = (
        dataclasses.replace(command.op, credentials=credentials)
        if isinstance(command.op, messages.Exec)
        else command.op
    )
    outgoing = server_wire.command_message(
        command_id=command.command_id,
        seq=command.seq,
        not_after=datetime(2026, 12, 7, tzinfo=UTC),
        origin=command.origin,
        spec=op,
    )
    read = device_wire.server_message(outgoing)
    assert isinstance(read, messages.Command)
    assert read.op == command.op
    expected = tuple(credentials) if isinstance(op, messages.Exec) else ()
    assert read.credentials == expected


@FUZZ
@given(strategy(messages.PairRequest), strategy(messages.PairResponse))
def test_pairing_round_trips(
    request: messages.PairRequest, response: messages.PairResponse
) -> None:
    assert (
        convert.from_message(convert.to_message(request, pb.PairRequest), messages.PairRequest)
        == request
    )
    assert (
        convert.from_message(convert.to_message(response, pb.PairResponse), messages.PairResponse)
        == response
    )


@FUZZ
@given(strategy(messages.Finished) | strategy(messages.Refused))
def test_a_journaled_result_reads_back(result: messages.Finished | messages.Refused) -> None:
    assert device_wire.decode_result(device_wire.encode_result(result)) == result


def test_the_times_round_trip() -> None:
    for value in (0.5, 1_733_000_000.123456, -1.25, 253402300799.999999999, 1.999999999):
        stamp = pb.Heartbeat().sent_at
        convert.set_seconds(stamp, value)
        assert 0 <= stamp.nanos < 10**9
        assert convert.seconds(stamp) == value
