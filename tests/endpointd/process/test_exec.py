"""endpointd runs exec commands for a (fake) control plane: a real daemon, real processes.

Each test pairs a fresh `endpointd` subprocess with a fake gateway over TLS, sends commands
through the real protocol and checks what comes back on the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from superagent_proto.v1 import endpoint_pb2 as pb
from tests.fakes.endpointd_process import Endpointd, endpointd_in, start_paired
from tests.fakes.gateway_server import FakeGateway, exec_command
from tests.support.helpers import assert_eventually


@pytest.fixture
def endpointd(tmp_path: Path) -> Iterator[Endpointd]:
    with endpointd_in(tmp_path) as daemon:
        yield daemon


STDOUT, STDERR = pb.OutputChunk.STREAM_STDOUT, pb.OutputChunk.STREAM_STDERR


@pytest.fixture
def gw() -> Iterator[FakeGateway]:
    with FakeGateway(tls=True) as gateway:
        yield gateway


async def _run(
    gw: FakeGateway, device: str, command: pb.Command, timeout: float = 15
) -> pb.Finished:
    sent = gw.send(device, command)
    finished = await assert_eventually(
        lambda: gw.finished(sent.command_id), timeout=timeout, message="no Finished"
    )
    assert isinstance(finished, pb.Finished)
    return finished


async def test_exec_round_trip_with_output_streams_and_exit_code(
    gw: FakeGateway, endpointd: Endpointd
) -> None:
    device = await start_paired(gw, endpointd)
    # The pauses are part of the command: bytes written to two pipes at the same instant
    # have no order to preserve; bytes written apart in time must arrive in that order.
    script = "echo out; sleep 0.2; echo err >&2; sleep 0.2; echo more; exit 7"
    sent = gw.send(device, exec_command(["sh", "-c", script]))
    await assert_eventually(lambda: gw.finished(sent.command_id))
    finished = gw.finished(sent.command_id)
    assert finished is not None
    assert (finished.exit_code, finished.signal, finished.error) == (7, 0, "")
    assert gw.output(sent.command_id) == b"out\nerr\nmore\n"
    assert gw.output(sent.command_id, STDOUT) == b"out\nmore\n"
    assert gw.output(sent.command_id, STDERR) == b"err\n"
    assert finished.total_output_bytes == len(b"out\nerr\nmore\n")
    assert gw.accepted_count(sent.command_id) == 1
    # Accepted comes first, the result last.
    kinds = [
        m.WhichOneof("msg")
        for m in gw.messages()
        if m.WhichOneof("msg") in ("accepted", "output", "finished")
    ]
    assert kinds[0] == "accepted"
    assert kinds[-1] == "finished"
    assert not gw.violations


async def test_stdin_env_and_cwd(gw: FakeGateway, endpointd: Endpointd, tmp_path: Path) -> None:
    device = await start_paired(gw, endpointd)
    work = tmp_path / "work dir"
    work.mkdir()
    cmd = exec_command(
        ["sh", "-c", 'cat; echo "[$TZ]"; pwd; test -t 0 || echo notty'],
        cwd=str(work),
        # A name exec.env may set without the owner's say (rules/environment.py).
        env={"TZ": "hello world"},
        stdin=b"from stdin\n",
    )
    finished = await _run(gw, device, cmd)
    assert finished.exit_code == 0
    sent_id = next(iter(gw.sent_commands))
    assert gw.output(sent_id) == f"from stdin\n[hello world]\n{work}\nnotty\n".encode()

    # Unset stdin is /dev/null (EOF at once), unlike an empty input.
    finished = await _run(gw, device, exec_command(["sh", "-c", "wc -c; echo ${HOME:+home-set}"]))
    second = list(gw.sent_commands)[-1]
    assert gw.output(second).split() == [b"0", b"home-set"]
    assert finished.exit_code == 0


async def test_missing_executable_and_cwd_are_reported_not_refused(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    device = await start_paired(gw, endpointd)
    finished = await _run(gw, device, exec_command(["/nonexistent/tool", "--x"]))
    assert finished.exit_code == 127
    assert "executable not found" in finished.error
    finished = await _run(gw, device, exec_command(["true"], cwd=str(tmp_path / "missing")))
    assert "working directory" in finished.error


async def test_timeout_kills_with_timed_out(gw: FakeGateway, endpointd: Endpointd) -> None:
    device = await start_paired(gw, endpointd)
    started = time.monotonic()
    finished = await _run(
        gw, device, exec_command(["sh", "-c", "echo start; sleep 30"], timeout_seconds=1)
    )
    assert finished.timed_out
    assert finished.signal == 15
    assert time.monotonic() - started < 10
    assert gw.output(list(gw.sent_commands)[-1]) == b"start\n"


async def test_a_long_line_is_split_into_64k_chunks_with_contiguous_offsets(
    gw: FakeGateway, endpointd: Endpointd
) -> None:
    device = await start_paired(gw, endpointd)
    size = 300_000  # one line, no newline until the end: nothing may wait for one
    script = f"import sys; sys.stdout.write('x' * {size - 1} + '\\n')"
    finished = await _run(gw, device, exec_command(["python3", "-c", script]))
    command_id = list(gw.sent_commands)[-1]
    chunks = gw.chunks(command_id)
    assert finished.total_output_bytes == size
    assert all(len(c.data) <= 64 * 1024 for c in chunks)
    assert len(chunks) >= 5
    offset = 0
    for chunk in chunks:
        assert chunk.offset == offset
        offset += len(chunk.data)
    assert offset == size
    assert gw.output(command_id) == b"x" * (size - 1) + b"\n"
    assert not gw.violations


async def test_expired_and_invalid_commands_are_refused_and_never_run(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    device = await start_paired(gw, endpointd)
    marker = tmp_path / "ran"
    expired = gw.send(
        device,
        exec_command(["touch", str(marker)], not_after=time.time() - 5),
    )
    empty = gw.send(device, exec_command([]))
    relative = gw.send(device, pb.Command(read_file=pb.ReadFile(path="relative/path")))
    unknown = gw.send(device, pb.Command())  # a kind this daemon predates
    await assert_eventually(lambda: gw.refused(unknown.command_id))
    reasons = {
        expired.command_id: pb.Refused.REASON_EXPIRED,
        empty.command_id: pb.Refused.REASON_INVALID,
        relative.command_id: pb.Refused.REASON_INVALID,
        unknown.command_id: pb.Refused.REASON_UNKNOWN_KIND,
    }
    for command_id, reason in reasons.items():
        refused = gw.refused(command_id)
        assert refused is not None
        assert refused.reason == reason, refused
        assert refused.message
        assert gw.accepted_count(command_id) == 0
    # A live deadline is fine.
    ok = await _run(gw, device, exec_command(["true"], not_after=time.time() + 60))
    assert ok.exit_code == 0
    assert not marker.exists()


def _pids(output: bytes) -> list[int]:
    return [int(line) for line in output.split()]


def _host_pid(endpointd: Endpointd, command_id: str, inner: int) -> int:
    """The pid, as this test sees it, of the command's process that knows itself as
    ``inner``: commands run in a PID namespace of their own, so `$$` is not our pid."""
    leader_file = endpointd.state_dir / "spool" / command_id / "child.pid"
    leader = int(leader_file.read_text())
    for proc in [psutil.Process(leader), *psutil.Process(leader).children(recursive=True)]:
        with contextlib.suppress(OSError, psutil.Error):
            status = Path(f"/proc/{proc.pid}/status").read_text()
            nspids = next(line for line in status.splitlines() if line.startswith("NSpid:"))
            if int(nspids.split()[-1]) == inner:
                return proc.pid
    raise AssertionError(f"no process of {command_id} is pid {inner} in its namespace")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_cancel_kills_the_whole_process_tree(gw: FakeGateway, endpointd: Endpointd) -> None:
    device = await start_paired(gw, endpointd)
    # A shell with a child and a grandchild (a subshell running its own sleep).
    script = (
        "echo top $$; sleep 1000 & echo child $!; (sleep 1000 & echo grandchild $!; wait) & wait"
    )
    target = gw.send(device, exec_command(["sh", "-c", script]))
    await assert_eventually(lambda: gw.output(target.command_id).count(b"\n") == 3)
    labelled: dict[str, int] = {}
    for line in gw.output(target.command_id).decode().splitlines():
        name, inner = line.split()

        def host(inner: int = int(inner)) -> int:
            return _host_pid(endpointd, target.command_id, inner)

        labelled[name] = await assert_eventually(host)
    top = labelled["top"]
    descendants = [p.pid for p in psutil.Process(top).children(recursive=True)]
    assert {labelled["child"], labelled["grandchild"]} <= set(descendants)
    pids = [top, *descendants]
    assert all(not _gone(p) for p in pids)

    cancel = gw.send(
        device,
        pb.Command(cancel=pb.CancelCommand(target_command_id=target.command_id, grace_seconds=2)),
    )
    done = await assert_eventually(lambda: gw.finished(target.command_id))
    assert done.signal == 15
    assert not done.timed_out
    cancel_done = await assert_eventually(lambda: gw.finished(cancel.command_id))
    assert (cancel_done.exit_code, cancel_done.error) == (0, "")
    await assert_eventually(lambda: all(_gone(p) for p in pids), timeout=5)

    # Cancelling something that is not running is an error for the cancel itself.
    again = gw.send(
        device, pb.Command(cancel=pb.CancelCommand(target_command_id=target.command_id))
    )
    failed = await assert_eventually(lambda: gw.finished(again.command_id))
    assert failed.exit_code != 0
    assert "not running" in failed.error
    unknown = gw.send(device, pb.Command(cancel=pb.CancelCommand(target_command_id="cmd_nope")))
    failed = await assert_eventually(lambda: gw.finished(unknown.command_id))
    assert "unknown command" in failed.error


async def test_cancel_escalates_to_sigkill_after_the_grace(
    gw: FakeGateway, endpointd: Endpointd
) -> None:
    device = await start_paired(gw, endpointd)
    script = "trap '' TERM; echo $$; sleep 1000 & wait; sleep 1000"
    target = gw.send(device, exec_command(["sh", "-c", script]))
    await assert_eventually(lambda: gw.output(target.command_id))
    (inner,) = _pids(gw.output(target.command_id))
    pid = await assert_eventually(lambda: _host_pid(endpointd, target.command_id, inner))
    gw.send(
        device,
        pb.Command(cancel=pb.CancelCommand(target_command_id=target.command_id, grace_seconds=1)),
    )
    done = await assert_eventually(lambda: gw.finished(target.command_id), timeout=10)
    assert done.signal == 9
    await assert_eventually(lambda: _gone(pid))


async def test_background_jobs_do_not_outlive_their_command(
    gw: FakeGateway, endpointd: Endpointd
) -> None:
    device = await start_paired(gw, endpointd)
    target = gw.send(
        device, exec_command(["sh", "-c", "sleep 1000 > /dev/null 2>&1 & echo $!; sleep 2"])
    )
    await assert_eventually(lambda: gw.output(target.command_id))
    (inner,) = _pids(gw.output(target.command_id))
    pid = await assert_eventually(lambda: _host_pid(endpointd, target.command_id, inner))
    finished = await assert_eventually(lambda: gw.finished(target.command_id), timeout=15)
    assert finished.exit_code == 0
    await assert_eventually(lambda: _gone(pid), timeout=5)


async def test_commands_run_concurrently_once_started(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    device = await start_paired(gw, endpointd)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # The first blocks until the second writes to the FIFO: only concurrency finishes both.
    reader = gw.send(device, exec_command(["sh", "-c", f"cat {fifo}"]))
    writer = gw.send(device, exec_command(["sh", "-c", f"echo ping > {fifo}"]))
    await assert_eventually(
        lambda: gw.finished(reader.command_id) and gw.finished(writer.command_id)
    )
    assert gw.output(reader.command_id) == b"ping\n"


async def test_commands_start_in_seq_order_and_expire_while_queued(
    gw: FakeGateway, endpointd: Endpointd, tmp_path: Path
) -> None:
    device = await start_paired(gw, endpointd)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # A read of a FIFO blocks until a writer appears, holding up everything queued behind it.
    blocker = gw.send(device, pb.Command(read_file=pb.ReadFile(path=str(fifo))))
    deadline = time.time() + 0.5
    late = gw.send(device, exec_command(["sh", "-c", "echo ran"], not_after=deadline))
    await assert_eventually(lambda: gw.accepted_count(late.command_id) == 1)
    # Waiting for the clock itself to pass the deadline, not for a process.
    await asyncio.sleep(max(0.0, deadline + 0.1 - time.time()))
    fifo.write_bytes(b"unblocked")  # the daemon holds the read end open already
    await assert_eventually(lambda: gw.refused(late.command_id))
    refused = gw.refused(late.command_id)
    assert refused is not None
    assert refused.reason == pb.Refused.REASON_EXPIRED
    await assert_eventually(lambda: gw.finished(blocker.command_id))
    assert gw.output(blocker.command_id) == b"unblocked"
    assert gw.output(late.command_id) == b""
    # The blocker's result precedes the refusal: seq 1 was dealt with before seq 2.
    results = [
        m.finished.command_id if m.HasField("finished") else m.refused.command_id
        for m in gw.messages()
        if m.HasField("finished") or m.HasField("refused")
    ]
    assert results.index(blocker.command_id) < results.index(late.command_id)
