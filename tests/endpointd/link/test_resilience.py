"""What makes endpointd safe to lose: redelivery, reconnects, daemon crashes, dead servers.

Every test drives a real `endpointd run` process; "crash" means SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from superagent_proto.v1 import endpoint_pb2 as pb
from tests.fakes.endpointd_process import Endpointd, endpointd_in, start_paired
from tests.fakes.gateway_server import FakeGateway, exec_command
from tests.support.helpers import assert_eventually


@pytest.fixture
def endpointd(tmp_path: Path) -> Iterator[Endpointd]:
    with endpointd_in(tmp_path) as daemon:
        yield daemon


# A command that records each run, prints, then waits for a go-file before finishing; the
# wait is the command's own behaviour, so the test decides when it ends.
WAIT_FOR_GO = (
    "echo run >> {runs}; echo started; while [ ! -e {go} ]; do sleep 0.02; done; echo done; exit 5"
)


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


async def test_redelivery_is_answered_but_never_run_twice(
    endpointd: Endpointd, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    with FakeGateway(auto_ack=False) as gw:
        device = await start_paired(gw, endpointd)
        cmd = gw.send(device, exec_command(["sh", "-c", f"echo run >> {runs}; echo output"]))
        await assert_eventually(lambda: gw.finished(cmd.command_id))

        # Finished but not acked: a byte-identical redelivery gets Accepted, output, result.
        gw.redeliver(device, cmd)
        await assert_eventually(lambda: gw.result_count(cmd.command_id) == 2)
        assert gw.accepted_count(cmd.command_id) == 2
        assert sum(c.data.count(b"output") for c in gw.chunks(cmd.command_id)) == 2

        # Same id, different content: refused as a duplicate, the original untouched.
        impostor = pb.Command()
        impostor.CopyFrom(cmd)
        impostor.exec.argv[:] = ["sh", "-c", f"echo impostor >> {runs}"]
        gw.redeliver(device, impostor)
        refused = await assert_eventually(lambda: gw.refused(cmd.command_id))
        assert refused.reason == pb.Refused.REASON_DUPLICATE

        # Acked: the journal keeps a compact record, so a late redelivery is still known.
        gw.ack(device, cmd.command_id, len(b"output\n"), finished=True)
        await assert_eventually(lambda: not _in_flight(endpointd))
        gw.redeliver(device, cmd)
        await assert_eventually(lambda: gw.accepted_count(cmd.command_id) == 3)
        await assert_eventually(lambda: gw.result_count(cmd.command_id) >= 3)
        assert _lines(runs) == 1
        assert "impostor" not in runs.read_text()


def _in_flight(daemon: Endpointd) -> list[dict[str, object]]:
    proc = daemon.cli("status", "--json")
    assert proc.returncode == 0, proc.stderr
    commands: list[dict[str, object]] = json.loads(proc.stdout)["commands"]
    return commands


async def test_reconnect_resends_unacked_output_from_the_acked_offset(
    endpointd: Endpointd, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    # 150 KB, then wait for the go-file, then 150 KB more: the stream is dropped in between.
    script = (
        "import os, sys, time\n"
        "out = sys.stdout.buffer\n"
        "out.write(bytes(i % 251 for i in range(150_000))); out.flush()\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.02)\n"
        "out.write(bytes(i % 241 for i in range(150_000))); out.flush()\n"
    )
    expected = bytes(i % 251 for i in range(150_000)) + bytes(i % 241 for i in range(150_000))
    with FakeGateway(auto_ack=False) as gw:
        device = await start_paired(gw, endpointd)
        cmd = gw.send(device, exec_command([sys.executable, "-c", script]))
        await assert_eventually(lambda: len(gw.output(cmd.command_id)) == 150_000)
        gw.ack(device, cmd.command_id, 70_001)  # not on a chunk boundary
        first = gw.connected(device)
        assert first is not None
        await assert_eventually(lambda: _acked_offset(endpointd) == 70_001)
        gw.drop(device)
        await assert_eventually(lambda: gw.session_count(device) == 2, timeout=15)
        go.touch()
        await assert_eventually(lambda: gw.finished(cmd.command_id), timeout=15)

        hello = gw.hellos(device)[-1]
        (item,) = hello.in_flight
        assert item.command_id == cmd.command_id
        assert item.acked_output_offset == 70_001
        assert item.state == pb.InFlight.STATE_RUNNING
        resent = [c for c in gw.chunks(cmd.command_id) if c in _session_chunks(gw, 1)]
        assert resent[0].offset == 70_001
        assert gw.output(cmd.command_id) == expected
        assert gw.finished(cmd.command_id).total_output_bytes == len(expected)  # type: ignore[union-attr]
        assert not gw.violations

        # Once everything is acked the device forgets it: the next Hello lists nothing.
        gw.ack(device, cmd.command_id, len(expected), finished=True)
        await assert_eventually(lambda: not _in_flight(endpointd))
        gw.drop(device)
        await assert_eventually(lambda: gw.session_count(device) == 3, timeout=15)
        await assert_eventually(lambda: len(gw.hellos(device)) == 3)
        assert list(gw.hellos(device)[-1].in_flight) == []
        assert not list((endpointd.state_dir / "spool").iterdir())


def _session_chunks(gw: FakeGateway, index: int) -> list[pb.OutputChunk]:
    return [m.output for m in gw.sessions[index].received if m.HasField("output")]


def _acked_offset(daemon: Endpointd) -> int:
    from endpointd.journal import Journal

    journal = Journal(daemon.state_dir / "journal.sqlite3", readonly=True)
    try:
        return max((e.acked_offset for e in journal.active()), default=-1)
    finally:
        journal.close()


async def test_daemon_crash_mid_command_reports_the_real_outcome_without_rerunning(
    endpointd: Endpointd, tmp_path: Path
) -> None:
    runs, go = tmp_path / "runs", tmp_path / "go"
    with FakeGateway() as gw:
        device = await start_paired(gw, endpointd)
        cmd = gw.send(device, exec_command(["sh", "-c", WAIT_FOR_GO.format(runs=runs, go=go)]))
        await assert_eventually(lambda: gw.output(cmd.command_id) == b"started\n")

        endpointd.kill9()
        go.touch()  # the command finishes while no daemon is alive
        await assert_eventually(lambda: list((endpointd.state_dir / "spool").glob("*/status.json")))
        endpointd.start()
        await assert_eventually(lambda: gw.session_count(device) == 2, timeout=15)
        hello = gw.hellos(device)[-1]
        assert [i.command_id for i in hello.in_flight] == [cmd.command_id]

        finished = await assert_eventually(lambda: gw.finished(cmd.command_id), timeout=15)
        assert (finished.exit_code, finished.error) == (5, "")
        assert gw.output(cmd.command_id) == b"started\ndone\n"
        # The server may well redeliver after a reconnect; it is answered, not re-run.
        gw.redeliver(device, cmd)
        await assert_eventually(lambda: gw.accepted_count(cmd.command_id) == 2)
        assert _lines(runs) == 1


async def test_crash_that_also_lost_the_supervisor_reports_unknown_outcome(
    endpointd: Endpointd, tmp_path: Path
) -> None:
    runs, go = tmp_path / "runs", tmp_path / "never"
    with FakeGateway() as gw:
        device = await start_paired(gw, endpointd)
        cmd = gw.send(device, exec_command(["sh", "-c", WAIT_FOR_GO.format(runs=runs, go=go)]))
        await assert_eventually(lambda: gw.output(cmd.command_id) == b"started\n")

        endpointd.kill9()
        # Written once the command outlives its first wait: soon after its first output.
        (pgid,) = await assert_eventually(lambda: endpointd.spool_pids("child.pid"))
        (supervisor,) = endpointd.spool_pids("supervisor.pid")
        os.kill(supervisor, signal.SIGKILL)
        os.killpg(pgid, signal.SIGKILL)
        endpointd.start()

        finished = await assert_eventually(lambda: gw.finished(cmd.command_id), timeout=15)
        assert finished.exit_code == -1
        assert "outcome unknown" in finished.error
        assert finished.total_output_bytes == len(b"started\n")
        assert _lines(runs) == 1


async def test_running_commands_survive_disconnects(endpointd: Endpointd, tmp_path: Path) -> None:
    runs, go = tmp_path / "runs", tmp_path / "go"
    with FakeGateway() as gw:
        device = await start_paired(gw, endpointd)
        cmd = gw.send(device, exec_command(["sh", "-c", WAIT_FOR_GO.format(runs=runs, go=go)]))
        await assert_eventually(lambda: gw.output(cmd.command_id) == b"started\n")
        gw.drop(device)
        go.touch()
        finished = await assert_eventually(lambda: gw.finished(cmd.command_id), timeout=15)
        assert finished.exit_code == 5
        assert gw.output(cmd.command_id) == b"started\ndone\n"
        assert _lines(runs) == 1


async def test_heartbeats_flow_and_a_silent_server_is_detected(endpointd: Endpointd) -> None:
    with FakeGateway(heartbeat_interval=1) as gw:
        device = await start_paired(gw, endpointd)
        await assert_eventually(lambda: len(gw.heartbeats()) >= 2, timeout=5)
        beats = gw.heartbeats()
        assert [b.seq for b in beats[:2]] == [1, 2]
        assert beats[1].sent_at.seconds > 0
        # The device echoes the highest server heartbeat it has seen.
        await assert_eventually(lambda: gw.heartbeats()[-1].ack_seq >= 1, timeout=5)

        gw.silent = True  # the TCP connection stays up; the server just stops talking
        await assert_eventually(
            lambda: "nothing received" in str(_daemon_status(endpointd).get("last_error")),
            timeout=10,
        )
        gw.silent = False
        await assert_eventually(
            lambda: gw.connected(device) and gw.session_count(device) >= 2, timeout=10
        )
        await assert_eventually(lambda: _daemon_status(endpointd)["state"] == "connected")


async def test_a_gateway_that_only_answers_heartbeats_is_enough(endpointd: Endpointd) -> None:
    """The real gateway only answers the device's heartbeats; silence is still noticed in time."""
    with FakeGateway(heartbeat_interval=1) as gw:
        gw.send_heartbeats = False
        gw.answer_heartbeats = True
        gw.answer_delay = 0.1  # more than the drift of the device's 1 s ticks on loopback
        device = await start_paired(gw, endpointd)
        await assert_eventually(lambda: len(gw.heartbeats()) >= 1, timeout=5)
        await asyncio.sleep(5)  # well past the 3 s silence limit: the answers count
        assert gw.connected(device)
        assert gw.session_count(device) == 1
        assert _daemon_status(endpointd)["state"] == "connected"

        # Fall silent 0.3 s after a device heartbeat, i.e. after its answer arrived (0.1 s).
        count = len(gw.heartbeats())
        await assert_eventually(lambda: len(gw.heartbeats()) > count, timeout=5, interval=0.01)
        await asyncio.sleep(0.3)
        silent_from = time.time()
        gw.silent = True

        def gave_up() -> dict[str, object] | None:
            status = _daemon_status(endpointd)
            return status if "nothing received" in str(status.get("last_error")) else None

        status = await assert_eventually(gave_up, timeout=10)
        # Three intervals after that answer (2.8 s from here), not at the device's first
        # heartbeat tick after that (3.7 s from here).
        noticed = Timestamp()
        noticed.FromJsonString(str(status["last_error_at"]))
        assert noticed.ToNanoseconds() / 1e9 - silent_from < 3.2


def _daemon_status(daemon: Endpointd) -> dict[str, object]:
    proc = daemon.cli("status", "--json")
    assert proc.returncode == 0, proc.stderr
    status: dict[str, object] = json.loads(proc.stdout)["daemon"]
    return status


async def test_a_revoked_device_keeps_retrying_and_status_shows_why(endpointd: Endpointd) -> None:
    with FakeGateway() as gw:
        device = await start_paired(gw, endpointd)
        gw.revoke(device)
        await assert_eventually(
            lambda: _daemon_status(endpointd).get("last_error_code") == "PERMISSION_DENIED",
            timeout=10,
        )
        status = endpointd.cli("status")
        assert "PERMISSION_DENIED" in status.stdout
        assert "rejected this device" in endpointd.log()
        assert endpointd.proc is not None
        assert endpointd.proc.poll() is None  # still running, backing off
        # Backoff, not a hot loop: 1 s, then ~1.6 s, ... between attempts.
        await assert_eventually(lambda: gw.session_count(device) >= 3, timeout=10)
        assert gw.session_count(device) <= 5
