"""The zygote: supervisors forked from a pre-imported process, with every guarantee kept.

In-process tests drive ``executor.Zygote`` directly (what the forked supervisor inherits,
the revoke/adopt hand-over); the rest run a real daemon and kill its zygote (and the
daemon) mid-command.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from endpointd.process import zygote as _zygote
from endpointd.process.executor import ExecLimits, Zygote, exec_spec, go, pid_alive, revoke_or_adopt
from endpointd.spool import ExitStatus, read_all
from superagent_shared.messages import Exec
from tests.fakes.endpointd_process import Endpointd, endpointd_in, start_paired
from tests.fakes.gateway_server import FakeGateway, exec_command
from tests.support.helpers import assert_eventually

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the zygote needs fork()")

WAIT_FOR_GO = (
    "echo run >> {runs}; echo started; while [ ! -e {go} ]; do sleep 0.02; done; echo done; exit 5"
)


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _spec(spool: Path, argv: list[str], cwd: Path, **fields: object) -> dict[str, object]:
    ex = Exec(argv=tuple(argv), cwd=str(cwd), **fields)  # type: ignore[arg-type]
    return exec_spec(spool, ex, limits=ExecLimits(max_timeout_seconds=60), default_cwd=cwd)


def _proc_status(pid: int) -> dict[str, str]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def _assert_clean_slate(pid: int, zygote_pid: int, spool: Path) -> None:
    if not sys.platform.startswith("linux"):
        return  # reads /proc
    status = _proc_status(pid)
    # Not the daemon's child, in a session of its own, nothing blocked or ignored.
    assert int(status["PPid"]) != os.getpid()
    assert os.getsid(pid) not in (os.getsid(0), os.getsid(zygote_pid))
    assert int(status["SigBlk"], 16) == 0
    # SIGPIPE only (bit 12): the zygote's ignored SIGCHLD (bit 16) must not be inherited.
    assert int(status["SigIgn"], 16) == 1 << (signal.SIGPIPE - 1)
    fds = {int(fd): os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    assert fds[0] == os.devnull
    assert fds[1] == os.devnull
    assert fds[2] == str(spool / "supervisor.log")
    # Its end of the socket that tells the daemon it is done, and nothing else.
    assert len([t for t in fds.values() if t.startswith("socket:")]) == 1, fds
    command = int((spool / "child.pid").read_text())
    command_fds = [
        os.readlink(f"/proc/{command}/fd/{fd}") for fd in os.listdir(f"/proc/{command}/fd")
    ]
    assert not [t for t in command_fds if t.startswith("socket:")], command_fds


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False


async def test_a_forked_supervisor_runs_the_command_with_a_clean_slate(
    zygote: Zygote, tmp_path: Path
) -> None:
    spool, go = tmp_path / "spool", tmp_path / "go"
    spec = _spec(
        spool,
        ["sh", "-c", f"read x; echo $x $ZY; while [ ! -e {go} ]; do sleep 0.02; done; exit 3"],
        tmp_path,
        env={"ZY": "env-ok"},
        stdin=b"stdin-ok\n",
    )
    pid, done = await zygote.launch(spool, spec)
    await assert_eventually(lambda: read_all(spool) == [(1, b"stdin-ok env-ok\n")])
    assert int((spool / "supervisor.pid").read_text()) == pid
    assert pid_alive(pid)  # it waits for the go-file
    await assert_eventually(
        lambda: (spool / "child.pid").read_text() if (spool / "child.pid").exists() else ""
    )
    _assert_clean_slate(pid, zygote.pid or 0, spool)
    assert not _closed(done)
    go.touch()
    await assert_eventually(lambda: _closed(done), timeout=15)
    # Closed once the outcome is recorded: the daemon reads it on that signal alone.
    status_file = ExitStatus.read(spool)
    assert status_file is not None
    assert status_file.exit_code == 3
    await assert_eventually(lambda: not pid_alive(pid))
    assert not (spool / "stdin").exists()


async def test_a_revoked_launch_never_runs_and_a_claimed_one_is_adopted(
    zygote: Zygote, tmp_path: Path
) -> None:
    # The daemon gave up first: the forked supervisor finds the claim taken and does nothing.
    revoked = tmp_path / "revoked"
    spec = _spec(revoked, ["sh", "-c", f"echo ran > {tmp_path / 'ran'}"], tmp_path)
    assert revoke_or_adopt(revoked) is None
    pid, done = await zygote.launch(revoked, spec)
    await assert_eventually(lambda: _closed(done))  # it ran nothing and closed its end
    done.close()
    await assert_eventually(lambda: not pid_alive(pid))
    assert not (tmp_path / "ran").exists()
    assert ExitStatus.read(revoked) is None
    assert "gave up" in (revoked / "supervisor.log").read_text()

    # The forked supervisor won: the daemon adopts it by the claimed pid.
    claimed = tmp_path / "claimed"
    pid, done = await zygote.launch(claimed, _spec(claimed, ["true"], tmp_path))
    done.close()
    await assert_eventually(lambda: (claimed / "supervisor.pid").exists())
    assert revoke_or_adopt(claimed) == pid
    await assert_eventually(lambda: ExitStatus.read(claimed), timeout=15)


async def test_a_gated_spare_starts_only_on_go_and_a_withdrawn_one_never(
    zygote: Zygote, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    started = tmp_path / "started"
    spec = _spec(started, ["sh", "-c", f"echo started > {marker}"], tmp_path)
    pid, done = await zygote.launch(started, spec, gated=True)
    await assert_eventually(lambda: (started / "supervisor.pid").exists())  # ready, claimed
    await asyncio.sleep(0.3)
    assert not marker.exists()  # waiting for the go
    go(done)
    await assert_eventually(lambda: _closed(done), timeout=15)
    assert marker.read_text() == "started\n"
    status = ExitStatus.read(started)
    assert status is not None
    assert status.exit_code == 0

    withdrawn = tmp_path / "withdrawn"
    spec = _spec(withdrawn, ["sh", "-c", f"echo withdrawn > {marker}"], tmp_path)
    pid, done = await zygote.launch(withdrawn, spec, gated=True)
    await assert_eventually(lambda: (withdrawn / "supervisor.pid").exists())
    done.close()  # the daemon withdraws it
    await assert_eventually(lambda: not pid_alive(pid))
    assert marker.read_text() == "started\n"
    assert ExitStatus.read(withdrawn) is None


async def test_a_dead_zygote_is_reported_and_restarted(zygote: Zygote, tmp_path: Path) -> None:
    assert zygote.proc is not None
    old = zygote.pid
    zygote.proc.kill()
    zygote.proc.wait()
    assert not zygote.ready()
    zygote.ensure_started()
    await assert_eventually(zygote.ready, timeout=20)
    assert zygote.pid != old
    spool = tmp_path / "spool"
    (await zygote.launch(spool, _spec(spool, ["true"], tmp_path)))[1].close()
    await assert_eventually(lambda: ExitStatus.read(spool), timeout=15)


def test_the_wire_format_round_trips() -> None:
    import socket

    a, b = socket.socketpair()
    with a, b:
        a.sendall(_zygote.encode({"spool": "/x", "spec": {"env": {"K": "v" * 100_000}}}))
        message = _zygote._recv_message(b)
        assert message is not None
        assert message["spec"]["env"]["K"] == "v" * 100_000
        a.close()
        assert _zygote._recv_message(b) is None


# ---------------------------------------------------------------------- a real daemon


@pytest.fixture
def endpointd(tmp_path: Path) -> Iterator[Endpointd]:
    with endpointd_in(tmp_path) as daemon:
        try:
            yield daemon
        finally:
            daemon.stop()
            for pid in _zygote_pids(daemon):
                if pid_alive(pid):
                    os.kill(pid, signal.SIGKILL)


def _zygote_pids(daemon: Endpointd) -> list[int]:
    return [int(p) for p in re.findall(r"zygote started \(pid (\d+)\)", daemon.log())]


def _started_via(daemon: Endpointd, command_id: str) -> str:
    match = re.search(rf"started {command_id}: .*\(supervisor pid \d+, ([^)]+)\)", daemon.log())
    return match.group(1) if match else ""


async def _zygote_ready(gw: FakeGateway, device: str, daemon: Endpointd) -> None:
    """Until a command is started by the zygote (the first may beat its start-up)."""

    async def via_zygote() -> bool:
        cmd = gw.send(device, exec_command(["true"]))
        await assert_eventually(lambda: gw.finished(cmd.command_id), timeout=15)
        return _started_via(daemon, cmd.command_id) == "zygote"

    await assert_eventually(via_zygote, timeout=30, interval=0.1)


async def test_killing_the_zygote_mid_command_neither_kills_nor_loses_it(
    endpointd: Endpointd, tmp_path: Path
) -> None:
    runs, go = tmp_path / "runs", tmp_path / "go"
    with FakeGateway() as gw:
        device = await start_paired(gw, endpointd)
        await _zygote_ready(gw, device, endpointd)
        cmd = gw.send(device, exec_command(["sh", "-c", WAIT_FOR_GO.format(runs=runs, go=go)]))
        await assert_eventually(lambda: gw.output(cmd.command_id) == b"started\n")
        assert _started_via(endpointd, cmd.command_id) == "zygote"

        (first,) = _zygote_pids(endpointd)
        os.kill(first, signal.SIGKILL)
        await assert_eventually(lambda: not pid_alive(first))
        go.touch()
        finished = await assert_eventually(lambda: gw.finished(cmd.command_id), timeout=15)
        assert (finished.exit_code, finished.error) == (5, "")
        assert gw.output(cmd.command_id) == b"started\ndone\n"

        # The next command falls back to a fresh interpreter and brings a zygote back.
        fallback = gw.send(device, exec_command(["sh", "-c", "echo fallback"]))
        await assert_eventually(lambda: gw.finished(fallback.command_id), timeout=15)
        assert gw.output(fallback.command_id) == b"fallback\n"
        assert _started_via(endpointd, fallback.command_id) == "fresh interpreter"
        await assert_eventually(lambda: len(_zygote_pids(endpointd)) == 2)
        await _zygote_ready(gw, device, endpointd)
        assert _lines(runs) == 1


async def test_killing_daemon_and_zygote_mid_command_still_reports_the_outcome(
    endpointd: Endpointd, tmp_path: Path
) -> None:
    runs, go = tmp_path / "runs", tmp_path / "go"
    with FakeGateway() as gw:
        device = await start_paired(gw, endpointd)
        await _zygote_ready(gw, device, endpointd)
        cmd = gw.send(device, exec_command(["sh", "-c", WAIT_FOR_GO.format(runs=runs, go=go)]))
        await assert_eventually(lambda: gw.output(cmd.command_id) == b"started\n")
        assert _started_via(endpointd, cmd.command_id) == "zygote"

        (zygote_pid,) = _zygote_pids(endpointd)
        endpointd.kill9()
        os.kill(zygote_pid, signal.SIGKILL)
        await assert_eventually(lambda: not pid_alive(zygote_pid))
        go.touch()  # the command finishes while neither is alive
        await assert_eventually(
            lambda: list((endpointd.state_dir / "spool").glob(f"{cmd.command_id}/status.json"))
        )
        endpointd.start()
        finished = await assert_eventually(lambda: gw.finished(cmd.command_id), timeout=20)
        assert (finished.exit_code, finished.error) == (5, "")
        assert gw.output(cmd.command_id) == b"started\ndone\n"
        gw.redeliver(device, cmd)
        await assert_eventually(lambda: gw.accepted_count(cmd.command_id) == 2)
        assert _lines(runs) == 1


async def test_the_zygote_exits_with_the_daemon(endpointd: Endpointd) -> None:
    with FakeGateway() as gw:
        device = await start_paired(gw, endpointd)
        await _zygote_ready(gw, device, endpointd)
        (zygote_pid,) = _zygote_pids(endpointd)
        endpointd.kill9()
        await assert_eventually(lambda: not pid_alive(zygote_pid), timeout=10)
