"""The one place where stored commands become protobuf messages."""

from __future__ import annotations

import time
from datetime import datetime

from google.protobuf.timestamp_pb2 import Timestamp

from controlplane.gateway import specs
from superagent_proto.v1 import endpoint_pb2 as pb

_DELIVERY = {
    "env": pb.CredentialRef.DELIVERY_ENV,
    "file": pb.CredentialRef.DELIVERY_FILE,
    "git_helper": pb.CredentialRef.DELIVERY_GIT_HELPER,
    # The value never reaches the command: the device's proxy adds it to HTTPS requests for
    # the credential's hosts (its local policy); env_var is unused.
    "http": pb.CredentialRef.DELIVERY_HTTP,
}


def timestamp(when: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(when)
    return stamp


def timestamp_now() -> Timestamp:
    """The current time; for every heartbeat, so cheaper than ``timestamp(datetime.now())``."""
    ns = time.time_ns()
    return Timestamp(seconds=ns // 1_000_000_000, nanos=ns % 1_000_000_000)


def command_message(
    *, command_id: str, seq: int, not_after: datetime, origin: str, spec: specs.Spec
) -> pb.ServerMessage:
    command = pb.Command(
        command_id=command_id, seq=seq, not_after=timestamp(not_after), origin=origin
    )
    if isinstance(spec, specs.Exec):
        command.exec.CopyFrom(
            pb.ExecCommand(
                argv=spec.argv, cwd=spec.cwd, env=spec.env, timeout_seconds=spec.timeout_seconds
            )
        )
        if spec.stdin is not None:
            command.exec.stdin = spec.stdin
        for use in spec.credentials:
            command.credentials.append(
                pb.CredentialRef(
                    name=use.name, delivery=_DELIVERY[use.delivery], env_var=use.env_var
                )
            )
    elif isinstance(spec, specs.ReadFile):
        command.read_file.CopyFrom(pb.ReadFile(path=spec.path, offset=spec.offset))
        if spec.limit is not None:
            command.read_file.limit = spec.limit
    elif isinstance(spec, specs.WriteFile):
        command.write_file.CopyFrom(
            pb.WriteFile(path=spec.path, content=spec.content, create_parents=spec.create_parents)
        )
        if spec.mode is not None:
            command.write_file.mode = spec.mode
        if spec.expected_sha256 is not None:
            command.write_file.expected_sha256 = spec.expected_sha256
    elif isinstance(spec, specs.ListDir):
        command.list_dir.CopyFrom(pb.ListDir(path=spec.path, depth=spec.depth))
    else:
        command.cancel.CopyFrom(
            pb.CancelCommand(
                target_command_id=spec.target_command_id, grace_seconds=spec.grace_seconds
            )
        )
    return pb.ServerMessage(command=command)


REFUSAL_REASONS = {
    value.number: value.name.removeprefix("REASON_").lower()
    for value in pb.Refused.Reason.DESCRIPTOR.values
}
