"""The exec supervisor's start-up and the daemon's event-driven view of its exit, in-process.

The end-to-end behaviour (output, timeouts, cancel, crash recovery) is covered against a
real daemon in test_exec/resilience; these pin down what makes it cheap: a bare
interpreter that imports almost nothing, a pidfd instead of the exit poll, and which journal
writes are fsync'd.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import endpointd.commands.daemon as daemon_module
from endpointd import wire
from endpointd.commands.daemon import Daemon
from endpointd.config import DeviceConfig, KeyConfig, TrustConfig
from endpointd.guard.policy import Policy
from endpointd.journal import Journal
from endpointd.process.executor import ExecLimits, supervisor_argv
from endpointd.spool import ExitStatus, read_all, spool_dir
from endpointd.status import StatusReporter
from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_shared.messages import Command, Finished

# What importing the supervisor may load beyond a bare `python -I -S`; anything heavier is a
# cost paid by every command.
FORBIDDEN_IN_SUPERVISOR = {
    "pathlib",
    "typing",
    "dataclasses",
    "tempfile",
    "shutil",
    "inspect",
    "endpointd.spool",
    "endpointd.process.executor",
    "endpointd.commands.daemon",
    "superagent_proto",
    "superagent_shared",
    "google",
    "grpc",
}


def _spec(argv: list[str], cwd: Path, **extra: object) -> bytes:
    spec = {
        "argv": argv,
        "cwd": str(cwd),
        "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        "timeout_seconds": 60,
        "kill_grace_seconds": 10,
        "stdin": False,
        **extra,
    }
    return json.dumps(spec).encode()


def test_supervisor_starts_bare_and_ignores_the_daemons_python_environment(
    tmp_path: Path,
) -> None:
    # A PYTHONPATH entry that would shadow both the stdlib and endpointd must be ignored.
    trap = tmp_path / "trap"
    (trap / "endpointd").mkdir(parents=True)
    (trap / "endpointd" / "__init__.py").write_text("raise SystemExit('wrong endpointd')\n")
    (trap / "json.py").write_text("raise SystemExit('wrong json')\n")
    spool = tmp_path / "spool"
    spool.mkdir()
    env = {**os.environ, "PYTHONPATH": str(trap), "PYTHONSTARTUP": str(trap / "json.py")}
    done = subprocess.run(
        supervisor_argv(spool),
        input=_spec(["sh", "-c", "echo out; echo err >&2; exit 3"], tmp_path),
        cwd=spool,
        env=env,
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    raw = json.loads((spool / "status.json").read_bytes())
    # The supervisor writes a plain dict: it must stay exactly ExitStatus's fields.
    assert set(raw) == {f.name for f in dataclasses.fields(ExitStatus)}
    status = ExitStatus.read(spool)
    assert status is not None
    assert (status.exit_code, status.signal, status.total_output_bytes) == (3, 0, 8)
    assert read_all(spool) == [(1, b"out\n"), (2, b"err\n")]
    assert int((spool / "supervisor.pid").read_text()) > 0
    assert not [p.name for p in spool.iterdir() if p.name.endswith(".tmp")]


def test_supervisor_imports_only_the_standard_library_essentials() -> None:
    argv = supervisor_argv(Path("unused"))
    probe = (
        "import sys; sys.path.append(sys.argv.pop(1)); import endpointd.process.supervisor; "
        "print('\\n'.join(sorted(sys.modules)))"
    )
    done = subprocess.run(
        [argv[0], "-I", "-S", "-c", probe, argv[5]],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    loaded = set(done.stdout.split())
    assert "endpointd.process.supervisor" in loaded
    heavy = {m for m in loaded if m in FORBIDDEN_IN_SUPERVISOR or m.split(".")[0] == "google"}
    assert not heavy, f"the supervisor imports {sorted(heavy)}"
    assert "site" not in loaded


def test_supervisor_still_runs_as_a_module(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "endpointd.process.supervisor", str(tmp_path)],
        input=_spec(["true"], tmp_path),
        cwd=tmp_path,
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    status = ExitStatus.read(tmp_path)
    assert status is not None
    assert status.exit_code == 0


def _daemon(tmp_path: Path, journal: Journal) -> Daemon:
    config = DeviceConfig(
        server_url="http://127.0.0.1:1",
        device_id="dev",
        device_name="dev",
        server_name="srv",
        trust=TrustConfig(mode="plaintext"),
        key=KeyConfig(storage="file", path=str(tmp_path / "device.key")),
        public_key="00" * 32,
        paired_at="2026-01-01T00:00:00+00:00",
    )
    (tmp_path / "spool").mkdir(exist_ok=True)
    policy_file = tmp_path / "config" / "policy.toml"
    policy_file.parent.mkdir(exist_ok=True)
    policy_file.write_text(f"allowed_roots = [{json.dumps(str(tmp_path))}]\n")
    policy_file.chmod(0o600)
    return Daemon(
        config,
        state_directory=tmp_path,
        journal=journal,
        # Its state dir is elsewhere: the daemon's own state dir (tmp_path) is a denied path.
        policy=Policy(policy_file, state_dir=tmp_path / "elsewhere"),
        status=StatusReporter(tmp_path, state="connected"),
        limits=ExecLimits(max_timeout_seconds=60),
        default_cwd=tmp_path,
    )


def _exec(command_id: str, seq: int, argv: list[str]) -> Command:
    return wire.command(pb.Command(command_id=command_id, seq=seq, exec=pb.ExecCommand(argv=argv)))


async def _until(predicate: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs pidfds (Linux >= 5.3)")
async def test_exit_is_seen_at_once_without_the_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        pytest.skip("pidfd_open is not supported by this kernel")
    # A monitor that effectively never polls: only the pidfd can finish these commands.
    monkeypatch.setattr(daemon_module, "MONITOR_INTERVAL", 3600.0)
    journal = Journal(tmp_path / "journal.sqlite3")
    daemon = _daemon(tmp_path, journal)
    daemon.recover()
    tasks = [asyncio.create_task(daemon.starter()), asyncio.create_task(daemon.monitor())]
    try:
        await asyncio.sleep(0)  # the monitor's first (and only) pass
        daemon.set_clock(time.time())
        daemon.handle_command(_exec("c1", 1, ["sh", "-c", "sleep 0.2; echo done"]))
        daemon.handle_command(_exec("c2", 2, ["sh", "-c", "exit 7"]))
        await _until(lambda: all(a.state == "finished" for a in daemon.commands.values()), 20)
        results = {cid: a.result for cid, a in daemon.commands.items()}
        assert isinstance(results["c1"], Finished)
        assert isinstance(results["c2"], Finished)
        assert results["c1"].exit_code == 0
        assert results["c1"].total_output_bytes == 5
        assert results["c2"].exit_code == 7
        assert not daemon._pidfds
        assert not daemon.children  # our supervisors were reaped, not left as zombies
        assert read_all(spool_dir(tmp_path, "c1")) == [(1, b"done\n")]
        entry = journal.get("c1")
        assert entry is not None
        assert entry.state == "finished"
        assert entry.pid is not None
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        daemon.close()
        journal.close()


def _previous_daemons_supervisor(spool: Path, spec: bytes) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(supervisor_argv(spool), stdin=subprocess.PIPE, cwd=spool)
    assert proc.stdin is not None
    proc.stdin.write(spec)
    proc.stdin.close()
    return proc


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs pidfds (Linux >= 5.3)")
async def test_a_reattached_supervisor_is_watched_too(tmp_path: Path) -> None:
    """After a daemon restart the supervisor is not our child; its exit is still an event."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        pytest.skip("pidfd_open is not supported by this kernel")
    journal = Journal(tmp_path / "journal.sqlite3")
    command = _exec("c1", 1, ["sleep", "0.3"])
    journal.insert(
        command_id="c1",
        seq=1,
        body=command.body,
        body_sha256=b"h" * 32,
        state="accepted",
        accepted=True,
    )
    journal.mark_running("c1")
    spool = spool_dir(tmp_path, "c1")
    spool.mkdir(parents=True)
    proc = _previous_daemons_supervisor(spool, _spec(["sleep", "0.3"], tmp_path))
    journal.set_pid("c1", proc.pid)
    daemon = _daemon(tmp_path, journal)
    try:
        daemon.recover()
        assert "c1" in daemon._pidfds
        await _until(lambda: daemon.commands["c1"].state == "finished", 20)
        result = daemon.commands["c1"].result
        assert isinstance(result, Finished)
        assert result.exit_code == 0
    finally:
        proc.wait(timeout=10)
        daemon.close()
        journal.close()


def test_only_what_stops_a_second_run_is_fsynced_before_going_on(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3")
    seen: list[str] = []
    journal._db.set_trace_callback(seen.append)
    journal.insert(
        command_id="c1", seq=1, body=b"b", body_sha256=b"h" * 32, state="accepted", accepted=True
    )
    journal.mark_running("c1")
    journal.set_pid("c1", 4321)
    journal.finish("c1", b"result", durable=False)  # as the daemon does; sync() follows
    journal.set_acked_offset("c1", 3)
    journal.mark_acked("c1", 3)
    journal._db.set_trace_callback(None)
    # Each write runs at the level in force when it commits (autocommit: at once).
    level = "FULL"
    writes: list[tuple[str, str]] = []
    for sql in seen:
        if sql.startswith("PRAGMA synchronous="):
            level = sql.split("=", 1)[1]
        elif sql.startswith(("INSERT", "UPDATE")):
            writes.append((level, sql))

    def level_of(fragment: str) -> str:
        (found,) = {lvl for lvl, sql in writes if fragment in sql}
        return found

    assert level_of("INSERT INTO commands") == "FULL"
    assert level_of("state = 'running'") == "FULL"
    assert level_of("state = 'finished'") == "NORMAL"
    assert level_of("SET pid =") == "NORMAL"
    assert level_of("SET acked_offset =") == "NORMAL"
    assert level_of("state = 'acked'") == "NORMAL"
    # And the connection is back to FULL afterwards.
    assert journal._db.execute("PRAGMA synchronous").fetchone() == (2,)
    journal.close()
    db = sqlite3.connect(tmp_path / "j.sqlite3")
    assert db.execute("SELECT state FROM commands").fetchall() == [("acked",)]
    db.close()


async def test_a_result_goes_to_the_writer_before_its_fsync_and_is_journaled_first(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "journal.sqlite3")
    daemon = _daemon(tmp_path, journal)
    order: list[str] = []
    real_sync = journal.sync

    def sync() -> None:
        order.append("fsync")
        real_sync()

    journal.sync = sync  # type: ignore[method-assign]
    daemon.set_clock(time.time())
    daemon.on_connected(asyncio.Queue())
    # Journaled `running` on receipt: nothing was queued ahead of it.
    daemon.handle_command(
        wire.command(
            pb.Command(
                command_id="c1",
                seq=1,
                write_file=pb.WriteFile(path=str(tmp_path / "f"), content=b"x"),
            )
        )
    )
    entry = journal.get("c1")
    assert entry is not None
    assert entry.state == "running"

    async def writer() -> None:  # what connection._writer does with the result
        while True:
            await daemon.wake.wait()
            daemon.wake.clear()
            message = daemon.next_output_message()
            if message is not None and message.HasField("finished"):
                order.append("sent")
                return

    task = asyncio.create_task(writer())
    await asyncio.sleep(0)
    starter = asyncio.create_task(daemon.starter())
    try:
        await asyncio.wait_for(task, 10)
        await _until(lambda: order.count("fsync") == 2, 5)
        # The journal row before anything ran; the result sent, then made durable.
        assert order == ["fsync", "sent", "fsync"]
        entry = journal.get("c1")
        assert entry is not None
        assert entry.state == "finished"
    finally:
        starter.cancel()
        await asyncio.gather(starter, return_exceptions=True)
        daemon.close()
        journal.close()


async def test_nothing_starts_and_no_accepted_goes_out_before_the_journal_is_durable(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "journal.sqlite3")
    daemon = _daemon(tmp_path, journal)
    released = threading.Event()
    real_sync = journal.sync

    def slow_sync() -> None:  # the fsync, in the daemon's worker thread
        released.wait(10)
        real_sync()

    journal.sync = slow_sync  # type: ignore[method-assign]
    control: asyncio.Queue[pb.DeviceMessage] = asyncio.Queue()
    daemon.set_clock(time.time())
    daemon.on_connected(control)
    starter = asyncio.create_task(daemon.starter())
    try:
        if daemon.zygote is not None:  # the spare path, where the fsync overlaps its set-up
            await _until(daemon.zygote.ready, 20)
        # In a directory of its own: the allowed root holds the (denied) config dir, so the
        # sandbox lets commands create files only in its other subdirectories.
        (tmp_path / "work").mkdir()
        marker = tmp_path / "work" / "ran"
        daemon.handle_command(_exec("c1", 1, ["sh", "-c", f"echo ran > {marker}"]))
        await asyncio.sleep(0.5)
        assert not marker.exists()
        assert control.empty()  # no Accepted yet
        released.set()
        await _until(marker.exists, 10)
        accepted = await asyncio.wait_for(control.get(), 5)
        assert accepted.accepted.command_id == "c1"
    finally:
        released.set()
        starter.cancel()
        await asyncio.gather(starter, return_exceptions=True)
        daemon.close()
        journal.close()
