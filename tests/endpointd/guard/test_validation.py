"""A command's structural validation (endpointd.guard.validation), before the policy."""

from __future__ import annotations

import pytest

from endpointd import wire
from endpointd.guard.validation import validate
from superagent_proto.v1 import endpoint_pb2 as pb


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (pb.Command(command_id="c", exec=pb.ExecCommand()), pb.Refused.REASON_INVALID),
        (pb.Command(command_id="c", exec=pb.ExecCommand(argv=["a\0b"])), pb.Refused.REASON_INVALID),
        (
            pb.Command(command_id="c", exec=pb.ExecCommand(argv=["ls"], cwd="rel")),
            pb.Refused.REASON_INVALID,
        ),
        (
            pb.Command(command_id="c", exec=pb.ExecCommand(argv=["ls"], env={"A=B": "x"})),
            pb.Refused.REASON_INVALID,
        ),
        (
            pb.Command(command_id="c", write_file=pb.WriteFile(path="/x", expected_sha256=b"1")),
            pb.Refused.REASON_INVALID,
        ),
        (pb.Command(command_id="c", list_dir=pb.ListDir(path="")), pb.Refused.REASON_INVALID),
        (
            pb.Command(command_id="c", cancel=pb.CancelCommand(target_command_id="c")),
            pb.Refused.REASON_INVALID,
        ),
        (pb.Command(command_id="c"), pb.Refused.REASON_UNKNOWN_KIND),
    ],
)
def test_validation_refusals(command: pb.Command, reason: int) -> None:
    refusal = validate(wire.command(command))
    assert refusal is not None
    assert refusal.reason == reason


def test_validation_accepts_well_formed_commands() -> None:
    for command in [
        pb.Command(command_id="c", exec=pb.ExecCommand(argv=["ls"])),
        pb.Command(command_id="c", read_file=pb.ReadFile(path="/etc/hosts")),
        pb.Command(command_id="c", write_file=pb.WriteFile(path="/x", expected_sha256=b"")),
    ]:
        assert validate(wire.command(command)) is None
