"""The device protocol's words as plain data: what the server asks, what the device answers.

Everything past :mod:`endpointd.wire` works on these: the policy judges a :class:`Command`,
validation checks it, the executor and the file operations carry out its ``op``, and the
daemon answers with a :class:`Finished` or a :class:`Refused`. Only ``wire`` converts them
from and to protobuf, so this module imports nothing of it; field names and meanings are
the ``.proto``'s (``proto/superagent_proto/v1/endpoint.proto``), with proto3's "unset"
spelled ``None`` where the protocol tells it apart from a zero (``optional`` fields).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal

__all__ = [
    "Ack",
    "Cancel",
    "Challenge",
    "Command",
    "CredentialRef",
    "Delivery",
    "Exec",
    "Finished",
    "Harness",
    "HarnessExec",
    "Heartbeat",
    "InFlight",
    "InFlightState",
    "ListDir",
    "Op",
    "PairResponse",
    "ReadFile",
    "Reason",
    "Refused",
    "Result",
    "RunHarness",
    "WriteFile",
]


class Delivery(enum.IntEnum):
    """How a credential reaches the command (``CredentialRef.Delivery``, same numbers)."""

    UNSPECIFIED = 0
    ENV = 1  # the value in environment variable env_var
    FILE = 2  # a 0600 file whose path is in env_var
    GIT_HELPER = 3  # endpointd answers git's credential requests for the policy's hosts
    HTTP = 4  # never reaches the command: the proxy adds it to HTTPS requests


class Reason(enum.IntEnum):
    """Why the device refused a command (``Refused.Reason``, same numbers)."""

    POLICY_DENIED = 1
    EXPIRED = 2
    UNKNOWN_KIND = 3
    DUPLICATE = 4
    INVALID = 5
    APPROVAL_DENIED = 6
    APPROVAL_TIMEOUT = 7
    CREDENTIAL_UNAVAILABLE = 8


@dataclass(slots=True, frozen=True)
class CredentialRef:
    name: str
    # A number this daemon does not know stays a plain int: delivery.check refuses it by
    # number, as a newer server should hear.
    delivery: Delivery | int = Delivery.UNSPECIFIED
    env_var: str = ""


@dataclass(slots=True, frozen=True)
class Exec:
    KIND: ClassVar[str] = "exec"

    argv: tuple[str, ...] = ()
    cwd: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_seconds: int = 0
    stdin: bytes | None = None  # None: /dev/null, distinct from an empty input


@dataclass(slots=True, frozen=True)
class ReadFile:
    KIND: ClassVar[str] = "read_file"

    path: str
    offset: int = 0
    limit: int | None = None


@dataclass(slots=True, frozen=True)
class WriteFile:
    KIND: ClassVar[str] = "write_file"

    path: str
    content: bytes = b""
    mode: int | None = None
    create_parents: bool = False
    # Empty: the file must not exist yet; None: write unconditionally.
    expected_sha256: bytes | None = None


@dataclass(slots=True, frozen=True)
class ListDir:
    KIND: ClassVar[str] = "list_dir"

    path: str
    depth: int = 0


@dataclass(slots=True, frozen=True)
class Cancel:
    KIND: ClassVar[str] = "cancel"

    target_command_id: str
    grace_seconds: int = 0


class WorkspaceBase(enum.IntEnum):
    """PrepareWorkspace.Base: where a ticket's worktree starts."""

    UNSPECIFIED = 0
    DEFAULT_BRANCH = 1
    PULL_REQUEST = 2
    LOCAL_CHANGES = 3


@dataclass(slots=True, frozen=True)
class PrepareWorkspace:
    KIND: ClassVar[str] = "prepare_workspace"

    ticket_id: str
    repo: str = ""  # normalised host/owner/name
    # A number this daemon does not know stays a plain int, refused by validation.
    base: WorkspaceBase | int = WorkspaceBase.DEFAULT_BRANCH
    ref: str = ""
    path: str = ""
    setup: bool = False


@dataclass(slots=True, frozen=True)
class ReleaseWorkspace:
    KIND: ClassVar[str] = "release_workspace"

    ticket_id: str


@dataclass(slots=True, frozen=True)
class Search:
    KIND: ClassVar[str] = "search"

    pattern: str
    path: str
    glob: str = ""
    literal: bool = False
    ignore_case: bool = False
    max_matches: int = 0  # 0: the policy's limit


@dataclass(slots=True, frozen=True)
class Glob:
    KIND: ClassVar[str] = "glob"

    pattern: str
    path: str
    max_entries: int = 0  # 0: the policy's limit


@dataclass(slots=True, frozen=True)
class RunHarness:
    """Run a coding-agent CLI installed here (:mod:`endpointd.harness`). Only the device
    turns it into a program: the daemon replaces it by the :class:`HarnessExec` its own
    table and policy build, before anything judges or runs it."""

    KIND: ClassVar[str] = "run_harness"

    harness: str
    cwd: str = ""
    prompt: str = ""
    resume_session: str = ""
    max_turns: int = 0  # 0: the harness's default (the policy's cap still applies)
    timeout_seconds: int = 0


@dataclass(slots=True, frozen=True)
class HarnessExec(Exec):
    """The exec the device built from a :class:`RunHarness` (:func:`endpointd.harness.runs.build`).

    An :class:`Exec` in every respect (KIND "exec"): the policy judges its real argv, the
    sandbox confines it, the redactor masks its output, a cancel stops its process tree.
    What it adds says where it came from: the request (for approvals and for building it
    again at its start), the harness's own credential (named for it in the local policy,
    so implicitly scoped to its runs), and the session-store directories its sandbox may
    also write.
    """

    request: RunHarness | None = None
    credential: str = ""
    session_dirs: tuple[str, ...] = ()


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


@dataclass(slots=True, frozen=True)
class Repository:
    """A git clone found under the allowed roots, as the device reports it."""

    path: str
    remote: str  # normalised host/owner/name; empty without a remote
    default_branch: str


@dataclass(slots=True, frozen=True)
class Harness:
    """A coding-agent CLI as the device reports it (``RepositoryReport.harnesses``)."""

    name: str
    version: str = ""  # first line of its --version, capped; empty when it did not answer
    allowed: bool = False  # [harness] allowed (or default) in the local policy
    logged_in: bool = False  # it has a login or a key to use


@dataclass(slots=True, frozen=True)
class Command:
    command_id: str = ""
    seq: int = 0
    # What to do; None when the server used a kind this daemon predates.
    op: Op | None = None
    credentials: tuple[CredentialRef, ...] = ()
    origin: str = ""
    # Deadline for starting it, in server time (seconds); None when the server set none.
    not_after: float | None = None
    # The Command as received, serialized deterministically (wire sets it): what the
    # journal keeps, and whose SHA-256 tells a redelivery from a reuse of the id.
    body: bytes = field(default=b"", repr=False, compare=False)

    @property
    def kind(self) -> str | None:
        """The protocol's name of ``op`` ("exec", "read_file", …), None if unknown."""
        return self.op.KIND if self.op is not None else None


@dataclass(slots=True, frozen=True)
class Ack:
    command_id: str
    acked_output_offset: int = 0
    finished: bool = False


@dataclass(slots=True, frozen=True)
class Challenge:
    nonce: bytes = b""
    server_time: float | None = None  # seconds; None when the server sent none
    protocol_version: int = 0  # the lowest the server speaks; 0: it did not say
    heartbeat_interval_seconds: int = 0
    max_protocol_version: int = 0  # 0 from a server older than the field
    server_version: str = ""  # the control plane's release; empty from an older server


@dataclass(slots=True, frozen=True)
class Heartbeat:
    seq: int = 0


@dataclass(slots=True, frozen=True)
class Finished:
    command_id: str
    exit_code: int = 0
    signal: int = 0
    error: str = ""
    total_output_bytes: int = 0
    duration_ns: int = 0
    timed_out: bool = False
    output_truncated: bool = False


@dataclass(slots=True, frozen=True)
class Refused:
    command_id: str
    reason: Reason
    message: str = ""


# A command's terminal answer, held until the server acknowledges it.
Result = Finished | Refused

InFlightState = Literal["accepted", "awaiting_approval", "running", "finished"]


@dataclass(slots=True, frozen=True)
class InFlight:
    command_id: str
    acked_output_offset: int
    state: InFlightState


@dataclass(slots=True, frozen=True)
class PairResponse:
    """What the server answers a pairing code with (``endpointd pair``)."""

    device_id: str
    server_cert_sha256: bytes  # SHA-256 of its leaf certificate's DER
    server_name: str
    server_ca_pem: str  # empty when its certificate chains to a public CA
    server_version: str = ""  # the control plane's release; empty from an older server
