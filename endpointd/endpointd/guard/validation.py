"""Structural checks on an incoming Command, before the policy and before journaling.

Malformed commands are refused with REASON_INVALID (or REASON_UNKNOWN_KIND when the kind is
newer than this daemon) and never run: an empty argv, a relative path, a NUL byte where the
OS cannot take one. Semantic limits (allowed roots, max runtime) belong to the policy.
"""

from __future__ import annotations

import os

from endpointd.guard.policy import Refusal
from superagent_proto.v1 import endpoint_pb2

_R = endpoint_pb2.Refused


def _invalid(message: str) -> Refusal:
    return Refusal(_R.REASON_INVALID, message)


def _absolute(path: str, field: str) -> Refusal | None:
    if not path:
        return _invalid(f"{field} is required")
    if "\x00" in path:
        return _invalid(f"{field} contains a NUL byte")
    if not os.path.isabs(path):
        return _invalid(f"{field} must be an absolute path, got {path!r}")
    return None


def validate(command: endpoint_pb2.Command) -> Refusal | None:
    if not command.command_id:
        return _invalid("command_id is required")
    kind = command.WhichOneof("kind")
    if kind is None:
        return Refusal(
            _R.REASON_UNKNOWN_KIND,
            "this endpointd does not know the command's kind; upgrade the daemon",
        )
    if kind == "exec":
        ex = command.exec
        if not ex.argv or not ex.argv[0]:
            return _invalid("exec.argv must be non-empty")
        if any("\x00" in a for a in ex.argv):
            return _invalid("exec.argv contains a NUL byte")
        if ex.cwd:
            bad = _absolute(ex.cwd, "exec.cwd")
            if bad:
                return bad
        for name, value in ex.env.items():
            if not name or "=" in name or "\x00" in name or "\x00" in value:
                return _invalid(f"exec.env has an invalid variable name or value: {name!r}")
        return None
    if kind == "read_file":
        return _absolute(command.read_file.path, "read_file.path")
    if kind == "write_file":
        wf = command.write_file
        bad = _absolute(wf.path, "write_file.path")
        if bad:
            return bad
        if wf.HasField("expected_sha256") and len(wf.expected_sha256) not in (0, 32):
            return _invalid("write_file.expected_sha256 must be empty or 32 bytes")
        if wf.HasField("mode") and wf.mode > 0o7777:
            return _invalid(f"write_file.mode {wf.mode:#o} is not a permission mode")
        return None
    if kind == "list_dir":
        return _absolute(command.list_dir.path, "list_dir.path")
    if kind == "cancel":
        target = command.cancel.target_command_id
        if not target:
            return _invalid("cancel.target_command_id is required")
        if target == command.command_id:
            return _invalid("a cancel cannot target itself")
        return None
    return Refusal(_R.REASON_UNKNOWN_KIND, f"unsupported command kind {kind!r}")
