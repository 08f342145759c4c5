"""What devices send the gateway, as plain data: the stream and pairing work on these alone.

:mod:`controlplane.gateway.wire` turns each DeviceMessage read from a Connect stream into
one of the dataclasses below, and a PairRequest into :class:`PairRequest`; nothing else in
the control plane sees protobuf, and this module imports none (a layering test,
tests/test_protobuf_boundary.py, keeps it so). Field names and meanings are the ``.proto``'s
(``proto/superagent_proto/v1/endpoint.proto``), limited to the fields the gateway reads:
each message is converted once per message received, so what is never read is not copied.
Enum values arrive as names (``"running"``, ``"duplicate"``), an unknown number as
``"unspecified"``, as the gateway has always treated one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar, Literal

__all__ = [
    "UNKNOWN",
    "Accepted",
    "AwaitingApproval",
    "DeviceMessage",
    "Finished",
    "Heartbeat",
    "Hello",
    "InFlight",
    "InFlightState",
    "OutputChunk",
    "PairRequest",
    "PairResponse",
    "Refused",
    "Unknown",
]

InFlightState = Literal["unspecified", "accepted", "awaiting_approval", "running", "finished"]


@dataclass(slots=True, frozen=True)
class PairRequest:
    pairing_code: str
    device_name: str
    public_key: bytes
    daemon_version: str
    protocol_version: int  # the lowest the daemon speaks; 0 from a daemon that did not say
    platform: str
    hostname: str
    max_protocol_version: int = 0  # 0 from a daemon older than the field


@dataclass(slots=True, frozen=True)
class PairResponse:
    device_id: str
    server_cert_sha256: bytes  # empty without TLS of our own
    server_name: str
    server_ca_pem: str  # empty without a CA of our own
    server_version: str = ""


@dataclass(slots=True, frozen=True)
class InFlight:
    """One command the device holds, from its Hello."""

    command_id: str
    acked_output_offset: int
    state: InFlightState


# The envelope's kinds. KIND is the DeviceMessage field's name, which error texts show.


@dataclass(slots=True, frozen=True)
class Hello:
    KIND: ClassVar[str] = "hello"

    device_id: str
    daemon_version: str
    protocol_version: int
    signature: bytes
    in_flight: tuple[InFlight, ...]
    policy_hash: bytes
    sandbox: str  # empty from a daemon older than the field
    # The range the daemon speaks; 0 from a daemon older than the fields.
    min_protocol_version: int = 0
    max_protocol_version: int = 0


@dataclass(slots=True, frozen=True)
class Heartbeat:
    KIND: ClassVar[str] = "heartbeat"

    seq: int


@dataclass(slots=True, frozen=True)
class Accepted:
    KIND: ClassVar[str] = "accepted"

    command_id: str


@dataclass(slots=True, frozen=True)
class OutputChunk:
    KIND: ClassVar[str] = "output"

    command_id: str
    offset: int
    data: bytes  # as received, not copied again


@dataclass(slots=True, frozen=True)
class Finished:
    KIND: ClassVar[str] = "finished"

    command_id: str
    exit_code: int
    signal: int
    error: str
    total_output_bytes: int
    timed_out: bool
    output_truncated: bool


@dataclass(slots=True, frozen=True)
class Refused:
    KIND: ClassVar[str] = "refused"

    command_id: str
    reason: str  # Refused.Reason without its prefix, lower case: "policy_denied", …
    message: str


@dataclass(slots=True, frozen=True)
class AwaitingApproval:
    KIND: ClassVar[str] = "awaiting_approval"

    command_id: str
    rule: str
    # None when the device sent none, or one that is not a representable time.
    deadline: datetime | None


@dataclass(slots=True, frozen=True)
class Repository:
    path: str
    remote: str  # normalised host/owner/name; empty when the clone has no remote
    default_branch: str


@dataclass(slots=True, frozen=True)
class Harness:
    """A coding-agent CLI a device has (``RunHarness`` runs it)."""

    name: str
    version: str
    allowed: bool  # its local policy lets the control plane run it
    logged_in: bool


@dataclass(slots=True, frozen=True)
class RepositoryReport:
    """The git repositories a device found under its allowed roots (replaces the last),
    and the harnesses it has."""

    KIND: ClassVar[str] = "repositories"

    repositories: tuple[Repository, ...]
    truncated: bool
    scanned_at: datetime | None
    harnesses: tuple[Harness, ...] = ()
    default_harness: str = ""


@dataclass(slots=True, frozen=True)
class Unknown:
    """An empty envelope, or one of a kind this gateway predates."""

    KIND: ClassVar[None] = None


UNKNOWN = Unknown()

DeviceMessage = (
    Hello
    | Heartbeat
    | Accepted
    | OutputChunk
    | Finished
    | Refused
    | AwaitingApproval
    | RepositoryReport
    | Unknown
)
