"""Structural checks on an incoming Command, before the policy and before journaling.

Malformed commands are refused with REASON_INVALID (or REASON_UNKNOWN_KIND when the kind is
newer than this daemon) and never run: an empty argv, a relative path, a NUL byte where the
OS cannot take one. Semantic limits (allowed roots, max runtime) belong to the policy.
"""

from __future__ import annotations

import os
import re

from endpointd.rules.decisions import Refusal
from superagent_shared.messages import (
    Cancel,
    Command,
    Exec,
    Glob,
    ListDir,
    PrepareWorkspace,
    ReadFile,
    Reason,
    ReleaseWorkspace,
    Search,
    WorkspaceBase,
    WriteFile,
)

# A ticket id names a directory and a git branch: the control plane's shape, nothing else.
TICKET_ID = re.compile(r"tkt_[0-9a-z]{4,40}\Z")
# A repository as devices report it: host/owner/name, more segments for nested groups.
REPOSITORY = re.compile(
    r"[A-Za-z0-9._~\[\]:-]+(/[A-Za-z0-9._~-]+){2,}\Z|[A-Za-z0-9._~-]+/[A-Za-z0-9._~-]+\Z"
)
# What git refuses in a branch name (git check-ref-format), and a leading "-" (an option).
_BAD_BRANCH = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|//|@\{|^[-/.]|[/.]$|\.lock$|/\.")


def _invalid(message: str) -> Refusal:
    return Refusal(Reason.INVALID, message)


def _absolute(path: str, field: str) -> Refusal | None:
    if not path:
        return _invalid(f"{field} is required")
    if "\x00" in path:
        return _invalid(f"{field} contains a NUL byte")
    if not os.path.isabs(path):
        return _invalid(f"{field} must be an absolute path, got {path!r}")
    return None


def validate(command: Command) -> Refusal | None:
    if not command.command_id:
        return _invalid("command_id is required")
    op = command.op
    if op is None:
        return Refusal(
            Reason.UNKNOWN_KIND,
            "this endpointd does not know the command's kind; upgrade the daemon",
        )
    if isinstance(op, Exec):
        if not op.argv or not op.argv[0]:
            return _invalid("exec.argv must be non-empty")
        if any("\x00" in a for a in op.argv):
            return _invalid("exec.argv contains a NUL byte")
        if op.cwd:
            bad = _absolute(op.cwd, "exec.cwd")
            if bad:
                return bad
        for name, value in op.env.items():
            if not name or "=" in name or "\x00" in name or "\x00" in value:
                return _invalid(f"exec.env has an invalid variable name or value: {name!r}")
        return None
    if isinstance(op, ReadFile):
        return _absolute(op.path, "read_file.path")
    if isinstance(op, WriteFile):
        bad = _absolute(op.path, "write_file.path")
        if bad:
            return bad
        if op.expected_sha256 is not None and len(op.expected_sha256) not in (0, 32):
            return _invalid("write_file.expected_sha256 must be empty or 32 bytes")
        if op.mode is not None and op.mode > 0o7777:
            return _invalid(f"write_file.mode {op.mode:#o} is not a permission mode")
        return None
    if isinstance(op, ListDir):
        return _absolute(op.path, "list_dir.path")
    if isinstance(op, Search | Glob):
        if not op.pattern:
            return _invalid(f"{op.KIND}.pattern is required")
        if "\x00" in op.pattern or (isinstance(op, Search) and "\x00" in op.glob):
            return _invalid(f"{op.KIND} contains a NUL byte")
        return _absolute(op.path, f"{op.KIND}.path")
    if isinstance(op, PrepareWorkspace | ReleaseWorkspace):
        return _workspace(op)
    if isinstance(op, Cancel):
        if not op.target_command_id:
            return _invalid("cancel.target_command_id is required")
        if op.target_command_id == command.command_id:
            return _invalid("a cancel cannot target itself")
        return None
    return Refusal(Reason.UNKNOWN_KIND, f"unsupported command kind {command.kind!r}")


def _workspace(op: PrepareWorkspace | ReleaseWorkspace) -> Refusal | None:
    kind = op.KIND
    if not TICKET_ID.match(op.ticket_id):
        return _invalid(
            f"{kind}.ticket_id must be a ticket id like tkt_8f3k2q9m4xw7, got {op.ticket_id!r}"
        )
    if isinstance(op, ReleaseWorkspace):
        return None
    if op.base not in tuple(WorkspaceBase):
        return Refusal(
            Reason.UNKNOWN_KIND,
            f"prepare_workspace.base {int(op.base)} is unknown to this endpointd; upgrade it",
        )
    if not op.repo and not op.path:
        return _invalid("prepare_workspace needs a repository (repo) or a directory (path)")
    if op.repo and (len(op.repo) > 300 or not REPOSITORY.match(op.repo)):
        return _invalid(
            "prepare_workspace.repo must be a repository as the device reports it"
            f" (host/owner/name), got {op.repo[:100]!r}"
        )
    if op.path:
        bad = _absolute(op.path, "prepare_workspace.path")
        if bad:
            return bad
    if op.base == WorkspaceBase.PULL_REQUEST:
        ref = op.ref.removeprefix("refs/heads/")
        if not ref:
            return _invalid("prepare_workspace on a pull request needs its head branch (ref)")
        if len(ref) > 255 or _BAD_BRANCH.search(ref) or ref == "@":
            return _invalid(f"prepare_workspace.ref {op.ref[:100]!r} is not a branch name")
    return None
