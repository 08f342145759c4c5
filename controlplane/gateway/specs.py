"""What a worker can ask a device to do, as plain data.

These dataclasses are the control plane's side of the device protocol: they are stored as
JSON in ``commands.spec`` and converted to protobuf in exactly one place (``wire.py``).
Credentials appear by name only; their values never leave the device.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Literal

from controlplane.errors import InvalidInput

# How the device hands a credential to a command: env (the value in ``env_var``), file (a
# 0600 file whose path is in ``env_var``), git_helper (git asks the device for it; ``env_var``
# is the optional git username), http (the device's proxy adds it to HTTPS requests for the
# credential's hosts: the value never reaches the command; ``env_var`` is unused).
Delivery = Literal["env", "file", "git_helper", "http"]
DELIVERIES: tuple[Delivery, ...] = ("env", "file", "git_helper", "http")


@dataclass(frozen=True)
class CredentialUse:
    name: str
    delivery: Delivery = "env"
    env_var: str = ""


@dataclass(frozen=True)
class Exec:
    argv: list[str]
    cwd: str = ""
    env: dict[str, str] = field(default_factory=dict)
    timeout_seconds: int = 0
    stdin: bytes | None = None
    credentials: list[CredentialUse] = field(default_factory=list)

    kind = "exec"

    @classmethod
    def shell(cls, script: str, **kwargs: Any) -> Exec:
        """A shell string runs as ``sh -c``: the device executes argv directly, never a shell
        of its own choosing."""
        return cls(argv=["sh", "-c", script], **kwargs)


@dataclass(frozen=True)
class ReadFile:
    path: str
    offset: int = 0
    limit: int | None = None

    kind = "read_file"


@dataclass(frozen=True)
class WriteFile:
    path: str
    content: bytes
    mode: int | None = None
    create_parents: bool = False
    expected_sha256: bytes | None = None

    kind = "write_file"


@dataclass(frozen=True)
class ListDir:
    path: str
    depth: int = 1

    kind = "list_dir"


@dataclass(frozen=True)
class Cancel:
    target_command_id: str
    grace_seconds: int = 0

    kind = "cancel"


# Where a ticket's workspace starts: the freshly fetched default branch, an existing pull
# request's head (``ref``), or a snapshot of the user's uncommitted changes.
WorkspaceBase = Literal["default_branch", "pull_request", "local_changes"]
WORKSPACE_BASES: tuple[WorkspaceBase, ...] = ("default_branch", "pull_request", "local_changes")


@dataclass(frozen=True)
class PrepareWorkspace:
    """The ticket's own git worktree on the device (its JSON answer: see the proto)."""

    ticket_id: str
    repo: str = ""  # normalised host/owner/name
    base: WorkspaceBase = "default_branch"
    ref: str = ""  # the pull request's head branch, for base "pull_request"
    path: str = ""  # the clone (or plain directory) to use; empty: the device's clone of repo
    setup: bool = True

    kind = "prepare_workspace"


@dataclass(frozen=True)
class ReleaseWorkspace:
    """The ticket ended: the device removes its workspace after the local retention."""

    ticket_id: str

    kind = "release_workspace"


@dataclass(frozen=True)
class Search:
    """File contents matching ``pattern`` under ``path``: JSON Lines of path, line, text."""

    pattern: str
    path: str
    glob: str = ""
    literal: bool = False
    ignore_case: bool = False
    max_matches: int = 0

    kind = "search"


@dataclass(frozen=True)
class Glob:
    """Paths under ``path`` matching ``pattern``, one per line, newest first."""

    pattern: str
    path: str
    max_entries: int = 0

    kind = "glob"


@dataclass(frozen=True)
class RunHarness:
    """Run the coding-agent CLI ``harness`` in ``cwd`` on the device, with ``prompt`` as its
    instruction; its event stream is the output. The device builds the program's argv, its
    environment and its credentials from its own table and local policy: here is only the
    harness's name, never a program or a flag."""

    harness: str
    cwd: str
    prompt: str
    resume_session: str = ""
    max_turns: int = 0
    timeout_seconds: int = 0

    kind = "run_harness"


Spec = (
    Exec
    | ReadFile
    | WriteFile
    | ListDir
    | Cancel
    | PrepareWorkspace
    | ReleaseWorkspace
    | Search
    | Glob
    | RunHarness
)


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(data: str | None) -> bytes | None:
    return None if data is None else base64.b64decode(data)


def validate(spec: Spec) -> None:
    if isinstance(spec, Exec):
        if not spec.argv or not all(isinstance(a, str) for a in spec.argv):
            raise InvalidInput("exec needs a non-empty argv of strings")
        for use in spec.credentials:
            if use.delivery not in DELIVERIES:
                raise InvalidInput(f"credential {use.name!r}: unknown delivery {use.delivery!r}")
            if use.delivery in ("env", "file") and not use.env_var:
                raise InvalidInput(f"credential {use.name!r} needs env_var for {use.delivery}")
    elif isinstance(spec, ReadFile | WriteFile | ListDir):
        if not spec.path:
            raise InvalidInput(f"{spec.kind} needs a path")
    elif isinstance(spec, Cancel) and not spec.target_command_id:
        raise InvalidInput("cancel needs a target command id")
    elif isinstance(spec, PrepareWorkspace):
        if not spec.ticket_id or not (spec.repo or spec.path):
            raise InvalidInput("prepare_workspace needs a ticket and a repository or path")
        if spec.base not in WORKSPACE_BASES:
            raise InvalidInput(f"prepare_workspace: unknown base {spec.base!r}")
        if spec.base == "pull_request" and not spec.ref:
            raise InvalidInput("prepare_workspace on a pull request needs its head branch (ref)")
    elif isinstance(spec, ReleaseWorkspace) and not spec.ticket_id:
        raise InvalidInput("release_workspace needs a ticket")
    elif isinstance(spec, Search | Glob) and not (spec.pattern and spec.path):
        raise InvalidInput(f"{spec.kind} needs a pattern and a path")
    elif isinstance(spec, RunHarness) and not (spec.harness and spec.cwd and spec.prompt):
        raise InvalidInput("run_harness needs a harness, a working directory and a prompt")


def to_json(spec: Spec) -> dict[str, Any]:
    if isinstance(spec, Exec):
        return {
            "argv": spec.argv,
            "cwd": spec.cwd,
            "env": spec.env,
            "timeout_seconds": spec.timeout_seconds,
            "stdin": _b64(spec.stdin),
            "credentials": [
                {"name": c.name, "delivery": c.delivery, "env_var": c.env_var}
                for c in spec.credentials
            ],
        }
    if isinstance(spec, ReadFile):
        return {"path": spec.path, "offset": spec.offset, "limit": spec.limit}
    if isinstance(spec, WriteFile):
        return {
            "path": spec.path,
            "content": _b64(spec.content),
            "mode": spec.mode,
            "create_parents": spec.create_parents,
            "expected_sha256": _b64(spec.expected_sha256),
        }
    if isinstance(spec, ListDir):
        return {"path": spec.path, "depth": spec.depth}
    if isinstance(spec, PrepareWorkspace | ReleaseWorkspace | Search | Glob | RunHarness):
        # Plain fields only (no bytes): the dataclass is its JSON.
        return dict(vars(spec))
    return {"target_command_id": spec.target_command_id, "grace_seconds": spec.grace_seconds}


def from_json(kind: str, data: dict[str, Any]) -> Spec:
    if kind == "exec":
        return Exec(
            argv=list(data["argv"]),
            cwd=data.get("cwd", ""),
            env=dict(data.get("env", {})),
            timeout_seconds=data.get("timeout_seconds", 0),
            stdin=_unb64(data.get("stdin")),
            credentials=[CredentialUse(**c) for c in data.get("credentials", [])],
        )
    if kind == "read_file":
        return ReadFile(data["path"], data.get("offset", 0), data.get("limit"))
    if kind == "write_file":
        content = _unb64(data["content"])
        assert content is not None
        return WriteFile(
            data["path"],
            content,
            data.get("mode"),
            data.get("create_parents", False),
            _unb64(data.get("expected_sha256")),
        )
    if kind == "list_dir":
        return ListDir(data["path"], data.get("depth", 1))
    if kind == "cancel":
        return Cancel(data["target_command_id"], data.get("grace_seconds", 0))
    plain: dict[str, type[PrepareWorkspace | ReleaseWorkspace | Search | Glob | RunHarness]] = {
        PrepareWorkspace.kind: PrepareWorkspace,
        RunHarness.kind: RunHarness,
        ReleaseWorkspace.kind: ReleaseWorkspace,
        Search.kind: Search,
        Glob.kind: Glob,
    }
    if kind in plain:
        return plain[kind](**data)
    raise InvalidInput(f"unknown command kind {kind!r}")
