"""The device protocol's messages as plain data, defined once for both programs.

Every message of ``proto/superagent_proto/v1/endpoint.proto`` that either side reads or
writes is a frozen dataclass here, with the ``.proto``'s field names and meanings: the
control plane builds commands of them and reads what devices send; endpointd reads the
commands and builds its answers. Neither program sees protobuf past its wire module
(``controlplane.gateway.wire``, ``endpointd.wire``), and both convert with the one
field-name-driven converter, :mod:`superagent_proto.convert`; this module imports no
protobuf, so a program's logic and its tests work on these alone. A test
(tests/shared/test_messages.py) keeps each class and its ``.proto`` message in step.

The conventions the converter relies on:

* A field has its ``.proto`` field's name. proto3's "unset" is ``None`` where the protocol
  tells it apart from a zero (``optional`` fields, Timestamps).
* An enum is an :class:`enum.IntEnum` with the ``.proto``'s numbers and its value names
  without their prefix (``Delivery.GIT_HELPER`` is ``DELIVERY_GIT_HELPER``). A number the
  receiver does not know stays a plain ``int``, so it can be refused by number, as a newer
  peer should hear.
* A point in time (a Timestamp) is seconds since the epoch, a float; a span (a Duration)
  is whole nanoseconds, an int, its field named with ``_ns``.
* ``KIND`` names the oneof field that carries a message: a command's op in ``Command.kind``,
  any other message in its stream envelope (``DeviceMessage.msg``, ``ServerMessage.msg``).

Adding a command kind is its ``.proto`` message, its class here (and in :data:`Op`), and
its handlers on each side; both converters and the control plane's stored-spec JSON
(``controlplane.gateway.specs``) follow the fields.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar

__all__ = [
    "UNKNOWN",
    "Accepted",
    "Ack",
    "AwaitingApproval",
    "Cancel",
    "Challenge",
    "Command",
    "CredentialRef",
    "Delivery",
    "DeviceMessage",
    "Exec",
    "Finished",
    "Glob",
    "Harness",
    "HarnessExec",
    "Heartbeat",
    "Hello",
    "InFlight",
    "InFlightState",
    "ListDir",
    "Op",
    "OutputChunk",
    "OutputStream",
    "PairRequest",
    "PairResponse",
    "PrepareWorkspace",
    "ReadFile",
    "Reason",
    "Refused",
    "ReleaseWorkspace",
    "Repository",
    "RepositoryReport",
    "Result",
    "RunHarness",
    "Search",
    "ServerMessage",
    "Unknown",
    "WorkspaceBase",
    "WriteFile",
    "enum_name",
    "utc",
]


# ---------------------------------------------------------------------------- enums


class Delivery(enum.IntEnum):
    """How a credential reaches the command (``CredentialRef.Delivery``)."""

    UNSPECIFIED = 0
    ENV = 1  # the value in environment variable env_var
    FILE = 2  # a 0600 file whose path is in env_var
    GIT_HELPER = 3  # endpointd answers git's credential requests; env_var: the git username
    HTTP = 4  # never reaches the command: the device's proxy adds it to HTTPS requests


class WorkspaceBase(enum.IntEnum):
    """Where a ticket's worktree starts (``PrepareWorkspace.Base``)."""

    UNSPECIFIED = 0
    DEFAULT_BRANCH = 1  # the clone's default branch, freshly fetched
    PULL_REQUEST = 2  # an existing pull request's head (``ref``)
    LOCAL_CHANGES = 3  # a snapshot of the user's uncommitted changes


class InFlightState(enum.IntEnum):
    """Where a journaled command is on the device (``InFlight.State``)."""

    UNSPECIFIED = 0
    ACCEPTED = 1
    AWAITING_APPROVAL = 2
    RUNNING = 3
    FINISHED = 4


class OutputStream(enum.IntEnum):
    """Which output stream a chunk came from (``OutputChunk.Stream``)."""

    UNSPECIFIED = 0
    STDOUT = 1
    STDERR = 2
    DATA = 3  # a file operation's payload


class Reason(enum.IntEnum):
    """Why the device refused a command (``Refused.Reason``)."""

    UNSPECIFIED = 0
    POLICY_DENIED = 1
    EXPIRED = 2
    UNKNOWN_KIND = 3
    DUPLICATE = 4
    INVALID = 5
    APPROVAL_DENIED = 6
    APPROVAL_TIMEOUT = 7
    CREDENTIAL_UNAVAILABLE = 8


def enum_name(value: enum.IntEnum | int) -> str:
    """``value``'s name in lower case ("policy_denied"); "unspecified" for a number its enum
    does not know, as the control plane records one."""
    return value.name.lower() if isinstance(value, enum.IntEnum) else "unspecified"


def utc(seconds: float | None) -> datetime | None:
    """A peer's point in time as an aware datetime; None when unset or not a representable
    (positive) time, so a hostile value is dropped rather than raised."""
    if seconds is None or seconds < 1:
        return None
    try:
        return datetime.fromtimestamp(seconds, UTC)
    except (ValueError, OverflowError, OSError):
        return None


# ---------------------------------------------------------------------------- commands


@dataclass(slots=True, frozen=True)
class CredentialRef:
    """A credential a command may use, by name only; its value never crosses the wire."""

    name: str
    # A number the receiver does not know stays a plain int (see the module's conventions).
    delivery: Delivery | int = Delivery.UNSPECIFIED
    env_var: str = ""


@dataclass(slots=True, frozen=True)
class Exec:
    """Run a program (``ExecCommand``). ``argv`` is stored as a tuple whatever sequence it
    was given, so two equal commands compare equal however they were built."""

    KIND: ClassVar[str] = "exec"

    argv: Sequence[str] = ()
    cwd: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_seconds: int = 0
    stdin: bytes | None = None  # None: /dev/null, distinct from an empty input
    # Not a field of ExecCommand: the control plane keeps a command's credentials with the
    # exec it stores, and its converter sends them as ``Command.credentials``, where the
    # device reads them (a device's Exec always has none here).
    credentials: Sequence[CredentialRef] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "argv", tuple(self.argv))
        object.__setattr__(self, "credentials", tuple(self.credentials))

    @classmethod
    def shell(cls, script: str, **kwargs: Any) -> Exec:
        """A shell string runs as ``sh -c``: the device executes argv directly, never a shell
        of its own choosing."""
        return cls(argv=("sh", "-c", script), **kwargs)


@dataclass(slots=True, frozen=True)
class ReadFile:
    KIND: ClassVar[str] = "read_file"

    path: str
    offset: int = 0
    limit: int | None = None  # None: up to the policy's max output size


@dataclass(slots=True, frozen=True)
class WriteFile:
    KIND: ClassVar[str] = "write_file"

    path: str
    content: bytes = b""
    mode: int | None = None  # None: 0644 for a new file, else the existing mode
    create_parents: bool = False
    # Empty: the file must not exist yet; None: write unconditionally.
    expected_sha256: bytes | None = None


@dataclass(slots=True, frozen=True)
class ListDir:
    KIND: ClassVar[str] = "list_dir"

    path: str
    depth: int = 0  # 0 and 1: the directory's own entries


@dataclass(slots=True, frozen=True)
class Cancel:
    """Stop a running command (``CancelCommand``)."""

    KIND: ClassVar[str] = "cancel"

    target_command_id: str
    grace_seconds: int = 0  # 0: the default (10 s)


@dataclass(slots=True, frozen=True)
class PrepareWorkspace:
    """The ticket's own git worktree on the device (its JSON answer: see the ``.proto``)."""

    KIND: ClassVar[str] = "prepare_workspace"

    ticket_id: str
    repo: str = ""  # normalised host/owner/name
    base: WorkspaceBase | int = WorkspaceBase.DEFAULT_BRANCH
    ref: str = ""  # the pull request's head branch, for base PULL_REQUEST
    path: str = ""  # the clone (or plain directory) to use; empty: the device's clone of repo
    setup: bool = False


@dataclass(slots=True, frozen=True)
class ReleaseWorkspace:
    """The ticket ended: the device removes its workspace after the local retention."""

    KIND: ClassVar[str] = "release_workspace"

    ticket_id: str


@dataclass(slots=True, frozen=True)
class Search:
    """File contents matching ``pattern`` under ``path``: JSON Lines of path, line, text."""

    KIND: ClassVar[str] = "search"

    pattern: str
    path: str
    glob: str = ""
    literal: bool = False
    ignore_case: bool = False
    max_matches: int = 0  # 0: the policy's limit


@dataclass(slots=True, frozen=True)
class Glob:
    """Paths under ``path`` matching ``pattern``, one per line, newest first."""

    KIND: ClassVar[str] = "glob"

    pattern: str
    path: str
    max_entries: int = 0  # 0: the policy's limit


@dataclass(slots=True, frozen=True)
class RunHarness:
    """Run the coding-agent CLI ``harness`` in ``cwd`` with ``prompt`` as its instruction.
    Only the device turns it into a program, from its own table and local policy: here is
    the harness's name, never a program, a flag or a credential."""

    KIND: ClassVar[str] = "run_harness"

    harness: str
    cwd: str = ""
    prompt: str = ""
    resume_session: str = ""
    max_turns: int = 0  # 0: the harness's default (the policy's cap still applies)
    timeout_seconds: int = 0


@dataclass(slots=True, frozen=True)
class HarnessExec(Exec):
    """The exec a device builds from a :class:`RunHarness` (``endpointd.harness.runs``);
    never on the wire.

    An :class:`Exec` in every respect (KIND "exec"): the policy judges its real argv, the
    sandbox confines it, the redactor masks its output, a cancel stops its process tree.
    What it adds says where it came from: the request (for approvals, for building it
    again at its start, and for its session store) and the harness's own credential (named
    for it in the local policy, so implicitly scoped to its runs).
    """

    request: RunHarness | None = None
    credential: str = ""


Op = (
    Exec
    | RunHarness
    | ReadFile
    | WriteFile
    | ListDir
    | Cancel
    | PrepareWorkspace
    | ReleaseWorkspace
    | Search
    | Glob
)


# ---------------------------------------------------------------------------- server to device


@dataclass(slots=True, frozen=True)
class Command:
    KIND: ClassVar[str] = "command"

    command_id: str = ""
    seq: int = 0
    # Deadline for starting it, in server time; None when the server set none.
    not_after: float | None = None
    credentials: tuple[CredentialRef, ...] = ()
    origin: str = ""
    # The ticket it serves, "" for none: a ticket's command works only in its workspace.
    ticket_id: str = ""
    # What to do (the ``kind`` oneof); None when the server used a kind this daemon predates.
    op: Op | None = None
    # The Command as received, serialized deterministically (endpointd's wire sets it): what
    # the journal keeps, and whose SHA-256 tells a redelivery from a reuse of the id.
    body: bytes = field(default=b"", repr=False, compare=False)

    @property
    def kind(self) -> str | None:
        """The protocol's name of ``op`` ("exec", "read_file", …), None if unknown."""
        return self.op.KIND if self.op is not None else None


@dataclass(slots=True, frozen=True)
class Challenge:
    KIND: ClassVar[str] = "challenge"

    nonce: bytes = b""
    server_time: float | None = None  # None when the server sent none
    protocol_version: int = 0  # the lowest the server speaks; 0: it did not say
    heartbeat_interval_seconds: int = 0
    max_protocol_version: int = 0  # 0 from a server older than the field
    server_version: str = ""  # the control plane's release; empty from an older server


@dataclass(slots=True, frozen=True)
class Heartbeat:
    """Liveness, in both directions."""

    KIND: ClassVar[str] = "heartbeat"

    seq: int = 0
    sent_at: float | None = None
    ack_seq: int = 0  # the highest seq received from the peer so far


@dataclass(slots=True, frozen=True)
class Ack:
    KIND: ClassVar[str] = "ack"

    command_id: str = ""
    acked_output_offset: int = 0
    finished: bool = False


# ---------------------------------------------------------------------------- device to server


@dataclass(slots=True, frozen=True)
class InFlight:
    """One command the device holds, in its Hello."""

    command_id: str = ""
    acked_output_offset: int = 0
    state: InFlightState | int = InFlightState.UNSPECIFIED


@dataclass(slots=True, frozen=True)
class Hello:
    KIND: ClassVar[str] = "hello"

    device_id: str = ""
    daemon_version: str = ""
    protocol_version: int = 0
    signature: bytes = b""
    in_flight: tuple[InFlight, ...] = ()
    policy_hash: bytes = b""
    sandbox: str = ""  # empty from a daemon older than the field
    # The range the daemon speaks; 0 from a daemon older than the fields.
    min_protocol_version: int = 0
    max_protocol_version: int = 0


@dataclass(slots=True, frozen=True)
class Accepted:
    KIND: ClassVar[str] = "accepted"

    command_id: str = ""


@dataclass(slots=True, frozen=True)
class OutputChunk:
    KIND: ClassVar[str] = "output"

    command_id: str = ""
    stream: OutputStream | int = OutputStream.UNSPECIFIED
    offset: int = 0
    data: bytes = b""  # as received, not copied again


@dataclass(slots=True, frozen=True)
class Finished:
    KIND: ClassVar[str] = "finished"

    command_id: str = ""
    exit_code: int = 0
    signal: int = 0
    error: str = ""
    total_output_bytes: int = 0
    duration_ns: int = 0
    timed_out: bool = False
    output_truncated: bool = False


@dataclass(slots=True, frozen=True)
class Refused:
    KIND: ClassVar[str] = "refused"

    command_id: str = ""
    reason: Reason | int = Reason.UNSPECIFIED
    message: str = ""


# A command's terminal answer, held until the server acknowledges it.
Result = Finished | Refused


@dataclass(slots=True, frozen=True)
class AwaitingApproval:
    KIND: ClassVar[str] = "awaiting_approval"

    command_id: str = ""
    rule: str = ""
    deadline: float | None = None  # device clock, corrected by the learnt offset


@dataclass(slots=True, frozen=True)
class Repository:
    """A git clone found under the allowed roots."""

    path: str = ""
    remote: str = ""  # normalised host/owner/name; empty when the clone has no remote
    default_branch: str = ""


@dataclass(slots=True, frozen=True)
class Harness:
    """A coding-agent CLI a device has (``RunHarness`` runs it)."""

    name: str = ""
    version: str = ""  # first line of its --version, capped; empty when it did not answer
    allowed: bool = False  # its local policy lets the control plane run it
    logged_in: bool = False  # it has a login or a key to use


@dataclass(slots=True, frozen=True)
class RepositoryReport:
    """The git repositories a device found under its allowed roots (replaces the last),
    and the harnesses it has."""

    KIND: ClassVar[str] = "repositories"

    repositories: tuple[Repository, ...] = ()
    truncated: bool = False
    scanned_at: float | None = None
    harnesses: tuple[Harness, ...] = ()
    default_harness: str = ""


@dataclass(slots=True, frozen=True)
class Unknown:
    """An empty envelope, or one of a kind this program predates."""

    KIND: ClassVar[None] = None


UNKNOWN = Unknown()

# What each stream envelope carries, as the receiving side reads it.
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
ServerMessage = Challenge | Heartbeat | Command | Ack | Unknown


# ---------------------------------------------------------------------------- pairing


@dataclass(slots=True, frozen=True)
class PairRequest:
    pairing_code: str = ""
    device_name: str = ""
    public_key: bytes = b""
    daemon_version: str = ""
    protocol_version: int = 0  # the lowest the daemon speaks; 0 from a daemon that did not say
    platform: str = ""
    hostname: str = ""
    max_protocol_version: int = 0  # 0 from a daemon older than the field


@dataclass(slots=True, frozen=True)
class PairResponse:
    device_id: str = ""
    server_cert_sha256: bytes = b""  # SHA-256 of the leaf certificate's DER; empty without TLS
    server_name: str = ""
    server_ca_pem: str = ""  # empty when the certificate chains to a public CA
    server_version: str = ""  # the control plane's release; empty from an older server
