"""The daemon's protocol translator (endpointd.wire): what proto3 tells apart survives,
and results survive the journal."""

from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp

from endpointd import wire
from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_shared.messages import (
    Delivery,
    Exec,
    Finished,
    ReadFile,
    Reason,
    Refused,
    Result,
    WriteFile,
)


def test_wire_keeps_what_proto3_tells_apart() -> None:
    """Unset optional fields are None (not zero), a zero deadline is none, a delivery or a
    kind this daemon does not know survives as such, and the body is what was received."""
    unset = wire.command(
        pb.Command(
            command_id="c",
            exec=pb.ExecCommand(argv=["ls"]),
            credentials=[pb.CredentialRef(name="x", delivery=7)],  # type: ignore[arg-type]
        )
    )
    assert isinstance(unset.op, Exec)
    assert unset.op.stdin is None
    assert unset.not_after is None
    assert unset.credentials[0].delivery == 7
    assert not isinstance(unset.credentials[0].delivery, Delivery)
    empty = wire.command(pb.Command(command_id="c", exec=pb.ExecCommand(argv=["ls"], stdin=b"")))
    assert isinstance(empty.op, Exec)
    assert empty.op.stdin == b""

    write = pb.Command(
        command_id="w",
        seq=3,
        not_after=Timestamp(seconds=0, nanos=0),
        write_file=pb.WriteFile(path="/x", mode=0, expected_sha256=b""),
    )
    plain = wire.command(write)
    assert plain.not_after is None
    assert plain.op == WriteFile(path="/x", mode=0, expected_sha256=b"")
    assert plain.body == write.SerializeToString(deterministic=True)
    assert wire.decode_command(plain.body) == plain
    read = wire.command(pb.Command(command_id="r", read_file=pb.ReadFile(path="/x")))
    assert read.op == ReadFile(path="/x", limit=None)
    assert wire.command(pb.Command(command_id="u")).op is None

    timed = wire.command(pb.Command(command_id="t", not_after=Timestamp(seconds=5, nanos=5)))
    assert timed.not_after == 5 + 5 / 1e9


def test_wire_results_survive_the_journal() -> None:
    results: list[Result] = [
        Finished(
            command_id="c",
            exit_code=3,
            signal=9,
            error="boom",
            total_output_bytes=12,
            duration_ns=1_234_567_891,
            timed_out=True,
            output_truncated=True,
        ),
        Refused(command_id="c", reason=Reason.APPROVAL_TIMEOUT, message="nobody"),
    ]
    for result in results:
        assert wire.decode_result(wire.encode_result(result)) == result
    sent = wire.result(results[1])
    assert sent.refused.reason == pb.Refused.REASON_APPROVAL_TIMEOUT
    assert wire.result(results[0]).finished.duration.ToNanoseconds() == 1_234_567_891
