"""One bad command never stops the device: what the daemon cannot judge or start fails alone.

A command naming ``/proc/1/exe`` once made the argv check's ``realpath`` raise inside the
stream's reader: the stream ended, the gateway delivered the command again on the next one,
and the device reconnected about 40 times in 30 s, working for no ticket. Here a real
endpointd, behind a gateway that redelivers what a device has not answered (as the real one
does), gets poison commands among good ones: paths whose resolution raises (another
process's ``/proc/PID/exe`` and ``cwd``), a working directory that cannot be entered, an
argv the kernel refuses, a path of megabytes (its refusal quoting it would be a result too
large for the gateway), and a clone under the allowed roots whose name is not UTF-8 (the
report naming it is a device message that could not be encoded). The good ones finish; each
poison one gets a result of its own that says why; the stream never reconnects; nothing is
delivered twice.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from superagent_proto.v1 import endpoint_pb2 as pb
from tests.fakes.endpointd_process import Endpointd, start_paired
from tests.fakes.gateway_server import FakeGateway
from tests.support.helpers import assert_eventually


@pytest.fixture
def gw() -> Iterator[FakeGateway]:
    with FakeGateway() as gateway:
        gateway.redeliver_unanswered = True
        yield gateway


@pytest.fixture
def zombie() -> Iterator[int]:
    """A child that has exited and is not reaped: its ``/proc/PID/exe`` and ``cwd`` links
    cannot be read by anyone, root included (``realpath`` raises on them)."""
    proc = subprocess.Popen(["true"])
    try:
        yield proc.pid
    finally:
        proc.wait()


def _is_zombie(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _odd_clone(work: Path) -> None:
    """A clone whose directory name is not UTF-8: the repository report names it."""
    odd = os.path.join(os.fsencode(work), b"\xff-clone")
    os.mkdir(odd)
    subprocess.run(["git", "init", "-q", odd], check=True)
    subprocess.run(
        ["git", "-C", odd, "remote", "add", "origin", "https://example.com/acme/odd.git"],
        check=True,
    )


def _exec(argv: list[str], cwd: Path | str) -> pb.Command:
    return pb.Command(exec=pb.ExecCommand(argv=argv, cwd=str(cwd)))


def _result(gw: FakeGateway, command_id: str) -> pb.Finished | pb.Refused | None:
    return gw.finished(command_id) or gw.refused(command_id)


def _why(result: pb.Finished | pb.Refused) -> str:
    return result.message if isinstance(result, pb.Refused) else result.error


async def test_poison_commands_fail_alone_and_the_stream_stays_up(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path, zombie: int
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    await asyncio.to_thread(_odd_clone, work)
    device = await start_paired(gw, endpointd)
    policy = endpointd.config_dir / "policy.toml"
    policy.write_text(f'allowed_roots = [{json.dumps(str(work))}]\ndefault_action = "allow"\n')
    policy.chmod(0o600)
    await assert_eventually(lambda: _is_zombie(zombie), timeout=10)
    await assert_eventually(lambda: gw.connected(device), timeout=20)
    sessions = gw.session_count(device)

    poison = [
        _exec(["cat", "/proc/1/exe"], work),
        _exec(["cat", f"/proc/{zombie}/exe"], work),
        _exec(["ls", f"/proc/{zombie}/cwd/x"], work),
        _exec(["ls"], f"/proc/{zombie}/cwd"),
        _exec(["ls"], work / "missing"),
        _exec(["true", "x" * (300 * 1024)], work),  # one argument past MAX_ARG_STRLEN
        pb.Command(read_file=pb.ReadFile(path=f"/proc/{zombie}/exe")),
        pb.Command(write_file=pb.WriteFile(path=f"/proc/{zombie}/cwd/.envrc", content=b"x")),
        pb.Command(list_dir=pb.ListDir(path=f"/proc/{zombie}/root")),
        # Refused quoting its path: a result larger than the gateway takes, were it whole.
        pb.Command(read_file=pb.ReadFile(path="relative/" + "x" * (5 << 20))),
    ]
    sent_good: list[str] = []
    sent_poison: list[str] = []
    for i, command in enumerate(poison):
        sent_poison.append(gw.send(device, command).command_id)
        good = gw.send(device, _exec(["sh", "-c", f"echo good-{i}"], work))
        sent_good.append(good.command_id)

    for i, command_id in enumerate(sent_good):
        finished = await assert_eventually(functools.partial(gw.finished, command_id), timeout=30)
        assert finished.exit_code == 0, finished
        assert gw.output(command_id) == f"good-{i}\n".encode()
    for command_id, command in zip(sent_poison, poison, strict=True):
        result = await assert_eventually(functools.partial(_result, gw, command_id), timeout=30)
        if command.exec.argv[:2] == ["cat", "/proc/1/exe"] and isinstance(result, pb.Finished):
            continue  # where /proc/1/exe resolves (root with ptrace rights), it is judged
        assert isinstance(result, pb.Refused) or result.exit_code != 0 or result.error, result
        assert _why(result) or result.exit_code != 0, result

    # The report of the clone with the odd name reached the gateway, in one piece.
    # The first report may predate the policy naming ``work``: wait for the one after it.
    def odd_reported() -> bool:
        reports = gw.messages("repositories")
        named = (r.path for m in reports for r in m.repositories.repositories)
        assert any(p.endswith("-clone") for p in named), (reports, endpointd.log())
        return True

    await assert_eventually(odd_reported, timeout=30)

    # Never a reconnect, never a command delivered twice, never the same result twice.
    assert gw.session_count(device) == sessions, endpointd.log()
    for command_id in sent_poison + sent_good:
        assert gw.result_count(command_id) == 1, (command_id, endpointd.log())

    # A poison command delivered again is answered from the journal, not judged again.
    gw.redeliver(device, gw.sent_commands[sent_poison[1]])
    await assert_eventually(lambda: gw.result_count(sent_poison[1]) == 2, timeout=15)
    assert gw.session_count(device) == sessions
    after = gw.send(device, _exec(["sh", "-c", "echo still-working"], work))
    await assert_eventually(lambda: gw.finished(after.command_id), timeout=15)
    assert gw.output(after.command_id) == b"still-working\n"
    assert gw.session_count(device) == sessions, endpointd.log()


async def test_a_command_the_daemon_died_judging_is_refused_when_delivered_again(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    """A crash no handler catches (the process killed, a fault in native code) while a
    command is judged would otherwise repeat on every redelivery: the daemon leaves the
    command's id in ``<state>/judging``, and the next one refuses that command alone. The
    death is staged (the file as a daemon killed mid-judgement leaves it): no command
    known today kills the daemon, which is the point of the rest of this module."""
    work = tmp_path / "work"
    work.mkdir()
    device = await start_paired(gw, endpointd)
    policy = endpointd.config_dir / "policy.toml"
    policy.write_text(f'allowed_roots = [{json.dumps(str(work))}]\ndefault_action = "allow"\n')
    policy.chmod(0o600)
    endpointd.stop()
    poison = pb.Command(command_id="cmd_diedjudging1", seq=gw.next_seq(device))
    poison.exec.CopyFrom(pb.ExecCommand(argv=["sh", "-c", "echo ran > ran"], cwd=str(work)))
    (endpointd.state_dir / "judging").write_text(poison.command_id)
    endpointd.start()
    await assert_eventually(lambda: len(gw.hellos(device)) >= 2, timeout=20)
    sessions = gw.session_count(device)

    gw.send(device, poison)
    good = gw.send(device, _exec(["sh", "-c", "echo fine"], work))
    refused = await assert_eventually(lambda: gw.refused(poison.command_id), timeout=15)
    assert "stopped while judging" in refused.message
    await assert_eventually(lambda: gw.finished(good.command_id), timeout=15)
    assert gw.output(good.command_id) == b"fine\n"
    assert not (work / "ran").exists()
    assert (endpointd.state_dir / "judging").read_text() == ""
    assert gw.session_count(device) == sessions


async def test_a_journaled_command_that_cannot_be_taken_up_again_fails_alone_at_start(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    """After a restart the journal is read back; one row that no longer reads (a body this
    release cannot decode, say) used to stop every start of the daemon. It fails alone."""
    work = tmp_path / "work"
    work.mkdir()
    device = await start_paired(gw, endpointd)
    policy = endpointd.config_dir / "policy.toml"
    policy.write_text(f'allowed_roots = [{json.dumps(str(work))}]\ndefault_action = "allow"\n')
    policy.chmod(0o600)
    endpointd.stop()
    journal = sqlite3.connect(endpointd.state_dir / "journal.sqlite3")
    with journal:
        journal.execute(
            "INSERT INTO commands (command_id, seq, body, body_sha256, state, accepted,"
            " received_at) VALUES ('cmd_unreadable01', 1, X'ffffffff0f', X'00', 'accepted',"
            " 1, 0)"
        )
    journal.close()
    endpointd.start()
    await assert_eventually(lambda: len(gw.hellos(device)) >= 2, timeout=20)
    failed = await assert_eventually(lambda: gw.finished("cmd_unreadable01"), timeout=15)
    assert failed.exit_code == -1
    assert "could not take this command up again" in failed.error
    good = gw.send(device, _exec(["sh", "-c", "echo fine"], work))
    await assert_eventually(lambda: gw.finished(good.command_id), timeout=15)
    assert gw.output(good.command_id) == b"fine\n"


async def test_a_command_whose_end_cannot_be_read_fails_alone(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    """The monitor reads each running command's status file; one that does not parse (a
    disk that filled mid-write, a supervisor of another release) used to end the monitor,
    and the daemon with it. That command fails alone, saying why."""
    work = tmp_path / "work"
    work.mkdir()
    device = await start_paired(gw, endpointd)
    policy = endpointd.config_dir / "policy.toml"
    policy.write_text(f'allowed_roots = [{json.dumps(str(work))}]\ndefault_action = "allow"\n')
    policy.chmod(0o600)
    sessions = gw.session_count(device)
    slow = gw.send(device, _exec(["sleep", "30"], work))
    spool = endpointd.state_dir / "spool" / slow.command_id
    await assert_eventually(lambda: (spool / "child.pid").exists(), timeout=20)
    (spool / "status.json").write_text("{not json")
    failed = await assert_eventually(lambda: gw.finished(slow.command_id), timeout=15)
    assert failed.exit_code == -1
    assert "could not follow this command" in failed.error
    good = gw.send(device, _exec(["sh", "-c", "echo fine"], work))
    await assert_eventually(lambda: gw.finished(good.command_id), timeout=15)
    assert gw.output(good.command_id) == b"fine\n"
    assert gw.session_count(device) == sessions, endpointd.log()
