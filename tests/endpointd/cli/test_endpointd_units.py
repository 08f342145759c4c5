"""Unit tests of endpointd's building blocks that need no daemon: spool, journal, backoff,
fingerprints, URL rules, validation, the wire's conversions."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from endpointd import wire
from endpointd.errors import TrustError
from endpointd.guard.validation import validate
from endpointd.journal import Journal
from endpointd.link.trust import is_loopback, parse_server_url
from endpointd.spool import SpoolReader, SpoolWriter, output_total, spool_dir
from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_shared.backoff import Backoff
from superagent_shared.gateway_tls import format_fingerprint, parse_fingerprint
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


def test_spool_reader_reassembles_any_offsets_and_keeps_streams_apart(tmp_path: Path) -> None:
    writer = SpoolWriter(tmp_path)
    rng = random.Random(7)
    records = []
    for _ in range(200):
        stream = rng.choice([1, 2])
        data = rng.randbytes(rng.choice([0, 1, 7, 500, 70_000]))
        writer.append(stream, data)
        records.append((stream, data))
    writer.close()
    combined = b"".join(d for _, d in records)
    assert output_total(tmp_path) == len(combined) == writer.total

    reader = SpoolReader(tmp_path)
    for start in [0, 1, len(combined) // 3, len(combined) - 1, 12345]:
        # Sequential reads from any start point, with rewinds in between, rebuild the rest.
        offset, out = start, bytearray()
        while (got := reader.read(offset, 64 * 1024)) is not None:
            stream, data = got
            assert 0 < len(data) <= 64 * 1024
            out += data
            offset += len(data)
        assert bytes(out) == combined[start:]
    assert reader.read(len(combined), 10) is None
    reader.close()


def test_spool_reader_merges_a_stream_run_and_stops_at_a_stream_change(tmp_path: Path) -> None:
    writer = SpoolWriter(tmp_path)
    for piece in (b"ab", b"cd", b"ef"):
        writer.append(1, piece)
    writer.append(2, b"ERR")
    writer.close()
    reader = SpoolReader(tmp_path)
    assert reader.read(1, 100) == (1, b"bcdef")
    assert reader.read(6, 100) == (2, b"ERR")
    assert reader.read(0, 3) == (1, b"abc")


def test_spool_dir_never_escapes_the_state_dir(tmp_path: Path) -> None:
    assert spool_dir(tmp_path, "cmd_abc").name == "cmd_abc"
    for hostile in ("../../etc", "/abs", "a/b", ".hidden", ""):
        path = spool_dir(tmp_path, hostile)
        assert path.parent == tmp_path / "spool"
        assert path.name.startswith("x-")


def test_journal_lifecycle_and_compaction(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3")
    journal.insert(
        command_id="c1", seq=2, body=b"body", body_sha256=b"h" * 32, state="accepted", accepted=True
    )
    journal.insert(
        command_id="c0", seq=1, body=b"b0", body_sha256=b"g" * 32, state="finished", accepted=False
    )
    assert [e.command_id for e in journal.active()] == ["c0", "c1"]
    journal.mark_running("c1")
    journal.set_pid("c1", 1234)
    journal.finish("c1", b"result")
    journal.mark_acked("c1", 99)
    entry = journal.get("c1")
    assert entry is not None
    assert (entry.state, entry.body, entry.result, entry.acked_offset) == (
        "acked",
        None,
        b"result",
        99,
    )
    assert entry.body_sha256 == b"h" * 32  # kept for dedupe
    assert [e.command_id for e in journal.active()] == ["c0"]
    assert journal.prune(older_than=-1) == 1
    assert journal.get("c1") is None
    journal.close()
    assert oct((tmp_path / "j.sqlite3").stat().st_mode & 0o777) == oct(0o600)


def test_backoff_grows_by_1_6_with_jitter_and_caps() -> None:
    backoff = Backoff()
    delays = [backoff.next_delay() for _ in range(20)]
    for attempt, delay in enumerate(delays):
        base = min(120.0, 1.6**attempt)
        assert base * 0.8 <= delay <= base * 1.2
    assert max(delays) <= 144
    backoff.reset()
    assert 0.8 <= backoff.next_delay() <= 1.2


def test_fingerprints_round_trip_in_every_accepted_spelling() -> None:
    digest = bytes(range(32))
    text = format_fingerprint(digest)
    assert text.startswith("sha256:00:01:02")
    for spelling in (text, text.lower(), digest.hex(), digest.hex().upper(), text[7:]):
        assert parse_fingerprint(spelling) == digest
    with pytest.raises(ValueError, match="32 bytes"):
        parse_fingerprint("abcd")
    with pytest.raises(ValueError, match="not a hex"):
        parse_fingerprint("xyz")


def test_url_rules() -> None:
    assert parse_server_url("https://gw.example.com").port == 443
    assert parse_server_url("https://[::1]:8443").target == "[::1]:8443"
    assert parse_server_url("http://localhost:9").scheme == "http"
    assert parse_server_url("http://127.0.0.2:9").host == "127.0.0.2"
    assert is_loopback("::1")
    assert not is_loopback("localhost.example.com")
    with pytest.raises(TrustError, match="plaintext"):
        parse_server_url("http://192.168.1.2:80")


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
