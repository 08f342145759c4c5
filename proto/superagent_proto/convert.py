"""The device protocol's one converter: plain messages to protobuf and back, by field name.

Both programs' wire modules (``controlplane.gateway.wire``, ``endpointd.wire``) convert
with this module, so a message class of :mod:`superagent_shared.messages` needs no
conversion code of its own on either side: :func:`to_message` and :func:`from_message`
walk the generated message's descriptor and the dataclass's fields together, matching them
by name, the way Temporal's one data converter serves both its client and its worker. It
lives beside the generated stubs, not in ``superagent_shared``, because it imports
protobuf, which the shared code must not (the import contracts in pyproject.toml).

What it does per field is decided once per class (:func:`_plan`), from the field's
descriptor and the dataclass's annotation, following the conventions the messages module
states: Timestamps are float seconds (None when unset), Durations whole nanoseconds in a
field named ``<name>_ns``, enums IntEnums (a number the receiver does not know stays an
int), ``optional`` scalars None when unset, nested messages and repeated fields dataclasses
and tuples, a map a dict, and a oneof of commands (``Command.kind``) the field typed as the
union of their classes, chosen by each class's ``KIND``. A dataclass field with no
``.proto`` field (``Command.body``, ``Exec.credentials``) is left alone: the wire module
that owns its meaning fills it. This module judges nothing.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

__all__ = [
    "by_kind",
    "fill",
    "from_message",
    "open_envelope",
    "seconds",
    "set_seconds",
    "to_envelope",
    "to_message",
]

T = TypeVar("T")
M = TypeVar("M", bound=Message)

_TIMESTAMP = Timestamp.DESCRIPTOR.full_name
_DURATION = Duration.DESCRIPTOR.full_name

Reader = Callable[[Any], Any]
Writer = Callable[[Any, Any], None]


# ---------------------------------------------------------------------------- times


def seconds(stamp: Timestamp) -> float:
    """A Timestamp as float seconds since the epoch."""
    return stamp.seconds + stamp.nanos / 1e9


def set_seconds(stamp: Timestamp, value: float) -> None:
    """Set ``stamp`` to float seconds ``value``; the whole seconds exactly, the fraction to
    the nearest nanosecond, so :func:`seconds` gives ``value`` back."""
    whole = math.floor(value)
    nanos = round((value - whole) * 1e9)
    if nanos >= 1_000_000_000:
        whole, nanos = whole + 1, nanos - 1_000_000_000
    stamp.seconds = whole
    stamp.nanos = nanos


# ---------------------------------------------------------------------------- the plans


def _hint_classes(hint: Any) -> list[Any]:
    """The classes a field's annotation names: ``A | B | None`` gives A and B,
    ``tuple[A, ...]`` gives A."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return [c for arg in typing.get_args(hint) for c in _hint_classes(arg)]
    if origin is not None:
        return [
            c for arg in typing.get_args(hint) if arg is not Ellipsis for c in _hint_classes(arg)
        ]
    return [] if hint is type(None) else [hint]


def _enum_of(hint: Any) -> type[enum.IntEnum] | None:
    for c in _hint_classes(hint):
        if isinstance(c, type) and issubclass(c, enum.IntEnum):
            return c
    return None


def _dataclass_of(hint: Any) -> type[Any]:
    for c in _hint_classes(hint):
        if dataclasses.is_dataclass(c):
            return c  # type: ignore[return-value]
    raise TypeError(f"no dataclass in {hint!r}")


def _decode_enum(kind: type[enum.IntEnum] | None) -> Callable[[int], Any]:
    if kind is None:
        return int

    def decode(number: int) -> enum.IntEnum | int:
        try:
            return kind(number)
        except ValueError:
            return number

    return decode


def _oneof_fields(hint: Any, descriptor: Descriptor) -> tuple[str, dict[str, type[Any]]] | None:
    """When ``hint`` is a union of classes with a ``KIND`` naming one oneof's fields: that
    oneof's name and its classes by KIND."""
    kinds = {c.KIND: c for c in _hint_classes(hint) if isinstance(getattr(c, "KIND", None), str)}
    if not kinds:
        return None
    first = descriptor.fields_by_name.get(next(iter(kinds)))
    if first is None or first.containing_oneof is None:
        return None
    return first.containing_oneof.name, kinds


Plan = tuple[list[tuple[str, Reader]], list[Writer]]
_PLANS: dict[tuple[type[Any], Any], Plan] = {}


def _plan(cls: type[Any], descriptor: Any) -> Plan:
    """How to read each of ``cls``'s fields from a message of ``descriptor``, and how to
    write each into one. Made once per class: conversions run for every message."""
    plan = _PLANS.get((cls, descriptor))
    if plan is None:
        plan = _PLANS[cls, descriptor] = _make_plan(cls, descriptor)
    return plan


def _make_plan(cls: type[Any], descriptor: Descriptor) -> Plan:
    hints = typing.get_type_hints(cls)
    readers: list[tuple[str, Reader]] = []
    writers: list[Writer] = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        hint = hints[f.name]
        fd = descriptor.fields_by_name.get(f.name)
        if fd is None and f.name.endswith("_ns"):
            fd = descriptor.fields_by_name.get(f.name.removesuffix("_ns"))
            if not _is_a(fd, _DURATION):
                fd = None  # only a Duration is named for its unit
        if fd is None:
            oneof = _oneof_fields(hint, descriptor)
            if oneof is not None:
                readers.append((f.name, _read_oneof(*oneof)))
                writers.append(_write_oneof(f.name))
            continue  # a field the .proto does not carry: its wire module fills it
        read, write = _field(f.name, fd, hint)
        readers.append((f.name, read))
        writers.append(write)
    return readers, writers


def _is_a(fd: FieldDescriptor | None, message_type: str) -> bool:
    found = None if fd is None else fd.message_type
    return found is not None and found.full_name == message_type


def _read_oneof(oneof: str, kinds: Mapping[str, type[Any]]) -> Reader:
    def read(message: Any) -> Any:
        which = message.WhichOneof(oneof)
        cls = kinds.get(which) if which is not None else None
        return None if cls is None else from_message(getattr(message, which), cls)

    return read


def _write_oneof(name: str) -> Writer:
    def write(message: Any, value: Any) -> None:
        member = getattr(value, name)
        if member is not None:
            sub = getattr(message, member.KIND)
            sub.SetInParent()
            fill(sub, member)

    return write


def _field(name: str, fd: FieldDescriptor, hint: Any) -> tuple[Reader, Writer]:
    proto = fd.name
    repeated = fd.is_repeated
    message_type = fd.message_type
    if message_type is not None and message_type.GetOptions().map_entry:
        return (
            lambda m: dict(getattr(m, proto)),
            lambda m, v: getattr(m, proto).update(getattr(v, name)),
        )
    if message_type is not None and message_type.full_name == _TIMESTAMP:

        def read_time(m: Any) -> float | None:
            return seconds(getattr(m, proto)) if m.HasField(proto) else None

        def write_time(m: Any, v: Any) -> None:
            value = getattr(v, name)
            if value is not None:
                set_seconds(getattr(m, proto), value)

        return read_time, write_time
    if message_type is not None and message_type.full_name == _DURATION:
        return (
            lambda m: getattr(m, proto).ToNanoseconds(),
            lambda m, v: getattr(m, proto).FromNanoseconds(getattr(v, name)),
        )
    if message_type is not None:
        cls = _dataclass_of(hint)
        if repeated:

            def write_all(m: Any, v: Any) -> None:
                items = getattr(m, proto)
                for item in getattr(v, name):
                    fill(items.add(), item)

            return (lambda m: tuple(from_message(x, cls) for x in getattr(m, proto)), write_all)

        def write_one(m: Any, v: Any) -> None:
            sub = getattr(m, proto)
            sub.SetInParent()
            fill(sub, getattr(v, name))

        return (lambda m: from_message(getattr(m, proto), cls), write_one)
    if repeated:
        return (
            lambda m: tuple(getattr(m, proto)),
            lambda m, v: getattr(m, proto).extend(getattr(v, name)),
        )
    if fd.enum_type is not None:
        decode = _decode_enum(_enum_of(hint))
        return (
            lambda m: decode(getattr(m, proto)),
            lambda m, v: setattr(m, proto, int(getattr(v, name))),
        )
    if fd.has_presence:  # an `optional` scalar: None when unset

        def write_optional(m: Any, v: Any) -> None:
            value = getattr(v, name)
            if value is not None:
                setattr(m, proto, value)

        return (lambda m: getattr(m, proto) if m.HasField(proto) else None, write_optional)
    return (lambda m: getattr(m, proto), lambda m, v: setattr(m, proto, getattr(v, name)))


# ---------------------------------------------------------------------------- conversions


def fill(message: Message, value: Any) -> None:
    """Write the dataclass ``value``'s fields into ``message`` (of its ``.proto`` type)."""
    for write in _plan(type(value), message.DESCRIPTOR)[1]:
        write(message, value)


def to_message(value: Any, message_type: type[M]) -> M:
    """The dataclass ``value`` as a new ``message_type``."""
    message = message_type()
    fill(message, value)
    return message


def from_message(message: Message, cls: type[T]) -> T:
    """``message`` as a ``cls`` (a dataclass of superagent_shared.messages)."""
    readers = _plan(cls, message.DESCRIPTOR)[0]
    return cls(**{name: read(message) for name, read in readers})


def by_kind(*classes: type[Any]) -> dict[str, type[Any]]:
    """``classes`` by their ``KIND``: what an envelope's oneof field names each one."""
    return {c.KIND: c for c in classes}


def to_envelope(value: Any, envelope_type: type[M]) -> M:
    """``value`` inside a new stream envelope, in the ``msg`` field its ``KIND`` names."""
    envelope = envelope_type()
    sub = getattr(envelope, value.KIND)
    sub.SetInParent()
    fill(sub, value)
    return envelope


def open_envelope(envelope: Message, kinds: Mapping[str, type[Any]]) -> Any:
    """What a stream envelope carries, as its class in ``kinds``; None when it is empty or
    of a kind not in ``kinds`` (one this program predates)."""
    which = envelope.WhichOneof("msg")
    cls = kinds.get(which) if which is not None else None
    return None if cls is None else from_message(getattr(envelope, which), cls)
