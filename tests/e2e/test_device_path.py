"""The device path end to end: real Postgres, real TLS gRPC gateway, real endpointd processes.

Crash tests kill things with SIGKILL (the daemon, the control plane, the network) and then
check that nothing was lost and nothing ran twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.db.pool import create_pool
from controlplane.db.urls import asyncpg_dsn
from controlplane.gateway import devices, specs
from controlplane.gateway.queue import CommandQueue
from controlplane.gateway.tls import ensure_server_tls
from tests.fakes.tcp_proxy import TcpProxy
from tests.support.daemon import Daemon, daemon_beside
from tests.support.gateway_harness import Gateway, pairing_code, running_gateway
from tests.support.helpers import assert_eventually, free_port

pytestmark = pytest.mark.slow


@pytest.fixture
async def gateway(
    db: async_sessionmaker[AsyncSession], database_url: str, tmp_path: Path
) -> AsyncIterator[Gateway]:
    async with running_gateway(database_url, db, tmp_path / "cp") as gw:
        yield gw


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with daemon_beside(tmp_path) as instance:
        yield instance


async def paired_daemon(
    gateway: Gateway, daemon: Daemon, name: str = "laptop", url: str = ""
) -> None:
    code = await gateway.pairing_code(name)
    result = await daemon.pair(
        url or f"https://127.0.0.1:{gateway.port}", code, "--fingerprint", gateway.tls.fingerprint
    )
    assert result.returncode == 0, result.stderr + result.stdout


def counting(count: int) -> specs.Exec:
    """A command printing 0..count-1, one line every 10 ms."""
    program = f"import time\nfor i in range({count}):\n print(i, flush=True)\n time.sleep(0.01)"
    return specs.Exec([sys.executable, "-c", program])


def lines(data: bytes) -> list[str]:
    return data.decode().splitlines()


async def test_pair_run_and_exec_round_trip(gateway: Gateway, daemon: Daemon) -> None:
    await paired_daemon(gateway, daemon)
    daemon.start()
    command_id = await gateway.queue.submit(
        "laptop", specs.Exec.shell("echo hello; echo oops >&2; exit 3")
    )
    result = await gateway.queue.wait(command_id, timeout=30)
    assert result.state == "finished", (result, daemon.log())
    assert result.exit_code == 3
    output = await gateway.queue.output(command_id)
    assert b"hello\n" in output
    assert b"oops\n" in output


async def test_refused_codes_give_one_clear_line(
    gateway: Gateway, daemon: Daemon, database_url: str
) -> None:
    url = f"https://127.0.0.1:{gateway.port}"
    wrong = await daemon.pair(url, "ABCD-EFGH")
    assert wrong.returncode != 0
    assert "wrong or unknown pairing code" in wrong.stderr
    assert "Traceback" not in wrong.stderr

    code = await gateway.pairing_code("mismatch")
    mismatch = await daemon.pair(url, code, "--fingerprint", "sha256:" + "00" * 32)
    assert mismatch.returncode != 0
    assert "fingerprint" in mismatch.stderr.lower()

    good = await gateway.pairing_code("box")
    assert (await daemon.pair(url, good)).returncode == 0
    other = Daemon(daemon.home.parent / "other")
    other.home.mkdir()
    reused = await other.pair(url, good)
    assert reused.returncode != 0
    assert "already used" in reused.stderr

    stale = await gateway.pairing_code("stale")
    pool = await create_pool(asyncpg_dsn(database_url), size=1)
    await pool.execute(
        "UPDATE pairing_codes SET expires_at = now() - interval '1 s' WHERE device_name = 'stale'"
    )
    await pool.close()
    third = Daemon(daemon.home.parent / "third")
    third.home.mkdir()
    expired = await third.pair(url, stale)
    assert expired.returncode != 0
    assert "expired" in expired.stderr


async def test_revoked_device_is_disconnected_and_refused(
    gateway: Gateway, daemon: Daemon, db: async_sessionmaker[AsyncSession]
) -> None:
    await paired_daemon(gateway, daemon)
    daemon.start()
    await daemon.wait_connected()
    await devices.revoke(gateway.pool, "laptop")

    async def disconnected() -> bool:
        return not await daemon.connected()

    async def says_revoked() -> bool:
        return "revoked" in str(await daemon.status())

    await assert_eventually(disconnected, timeout=10, interval=0.2)
    await assert_eventually(says_revoked, timeout=30, interval=0.5, message=daemon.log())


async def test_offline_queue_runs_in_order_and_expired_commands_never_run(
    gateway: Gateway, daemon: Daemon, tmp_path: Path
) -> None:
    await paired_daemon(gateway, daemon)
    journal = tmp_path / "order.txt"
    ids = [
        await gateway.queue.submit("laptop", specs.Exec.shell(f"echo {i} >> {journal}"))
        for i in range(1, 4)
    ]
    stale = await gateway.queue.submit(
        "laptop", specs.Exec.shell(f"echo stale >> {journal}"), ttl=timedelta(0)
    )
    daemon.start()
    for command_id in ids:
        assert (await gateway.queue.wait(command_id, 30)).state == "finished", daemon.log()
    assert (await gateway.queue.result(stale)).state == "expired"
    # Started in seq order (the device starts them one by one); they may then run side by
    # side, so the file shows the set, and the device's journal the order they started in.
    assert sorted(journal.read_text().split()) == ["1", "2", "3"]
    device_journal = sqlite3.connect(daemon.home / "state" / "journal.sqlite3")
    try:
        started = device_journal.execute(
            "SELECT command_id FROM commands WHERE started_at IS NOT NULL ORDER BY started_at"
        ).fetchall()
    finally:
        device_journal.close()
    assert [row[0] for row in started] == ids


async def test_killed_daemon_reports_the_outcome_and_never_reruns(
    gateway: Gateway, daemon: Daemon, tmp_path: Path
) -> None:
    await paired_daemon(gateway, daemon)
    process = daemon.start()
    marker = tmp_path / "runs.txt"
    command_id = await gateway.queue.submit(
        "laptop", specs.Exec.shell(f"echo started >> {marker}; sleep 3; echo finished")
    )
    await assert_eventually(marker.exists, timeout=30, message=daemon.log())
    daemon.kill(process)
    daemon.start()
    result = await gateway.queue.wait(command_id, timeout=60)
    assert result.done, daemon.log()
    assert marker.read_text() == "started\n", "the command ran twice"
    if result.state == "finished":
        assert await gateway.queue.output(command_id) == b"finished\n"
    else:
        assert result.error


async def test_killed_control_plane_loses_and_duplicates_no_output(
    database_url: str, db: async_sessionmaker[AsyncSession], daemon: Daemon, tmp_path: Path
) -> None:
    state = tmp_path / "cp"
    tls = ensure_server_tls(state / "tls")
    grpc_port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "SUPERAGENT_STATE_DIR": str(state),
        "SUPERAGENT_GRPC__PORT": str(grpc_port),
        "SUPERAGENT_HTTP__PORT": "0",
    }

    def start_server() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "controlplane.cli", "serve"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    server = start_server()
    pool = await create_pool(asyncpg_dsn(database_url), size=4)
    queue = CommandQueue(pool)
    try:
        code = await pairing_code(db, "laptop")
        url = f"https://127.0.0.1:{grpc_port}"

        async def paired() -> bool:
            result = await daemon.pair(url, code, "--fingerprint", tls.fingerprint)
            return result.returncode == 0

        await assert_eventually(paired, timeout=30, interval=0.5)
        daemon.start()
        count = 400
        command_id = await queue.submit(
            "laptop",
            counting(count),
        )
        await assert_eventually(
            lambda: _has_output(queue, command_id), timeout=30, message=daemon.log()
        )
        server.send_signal(signal.SIGKILL)
        server.wait(10)
        await asyncio.sleep(1)
        server = start_server()
        result = await queue.wait(command_id, timeout=60)
        assert result.state == "finished", daemon.log()
        output = await queue.output(command_id, 0, 1 << 20)
        assert lines(output) == [str(i) for i in range(count)]
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait(10)
        await queue.close()
        await pool.close()


async def _has_output(queue: CommandQueue, command_id: str) -> bool:
    return (await queue.result(command_id)).output_size > 0


async def test_flaky_network_delivers_all_output_exactly_once(
    gateway: Gateway, daemon: Daemon
) -> None:
    proxy = await TcpProxy("127.0.0.1", gateway.port).start()
    try:
        await paired_daemon(gateway, daemon, url=f"https://127.0.0.1:{proxy.port}")
        daemon.start()
        await daemon.wait_connected()
        proxy.drop_every(3.0)
        count = 3000  # 30 s of continuous output
        command_id = await gateway.queue.submit(
            "laptop",
            counting(count),
        )
        result = await gateway.queue.wait(command_id, timeout=120)
        assert result.state == "finished", daemon.log()
        assert proxy.drops >= 5
        output = await gateway.queue.output(command_id, 0, 1 << 20)
        assert lines(output) == [str(i) for i in range(count)]
    finally:
        await proxy.stop()


async def test_cancel_kills_the_whole_process_tree(gateway: Gateway, daemon: Daemon) -> None:
    await paired_daemon(gateway, daemon)
    daemon.start()
    command_id = await gateway.queue.submit(
        "laptop",
        specs.Exec.shell("sleep 1000 & echo $!; (sleep 1000 & echo $!; wait) & wait"),
    )

    async def two_pids() -> list[int]:
        found = (await gateway.queue.output(command_id)).split()
        return [int(p) for p in found] if len(found) >= 2 else []

    inner = await assert_eventually(two_pids, timeout=30, message=daemon.log())
    # The command runs in a PID namespace of its own: find our pids of its processes.
    leader_file = daemon.home / "state" / "spool" / command_id / "child.pid"

    def host_pids() -> list[int]:
        leader = psutil.Process(int(leader_file.read_text()))
        found = {}
        for proc in leader.children(recursive=True):
            with contextlib.suppress(OSError, psutil.Error):
                status = Path(f"/proc/{proc.pid}/status").read_text()
                nspid = next(x for x in status.splitlines() if x.startswith("NSpid:"))
                found[int(nspid.split()[-1])] = proc.pid
        assert set(inner) <= set(found), (inner, found)
        return [found[p] for p in inner]

    pids = await assert_eventually(host_pids, timeout=15)
    assert all(psutil.pid_exists(pid) for pid in pids)
    await gateway.queue.cancel(command_id, grace_seconds=1)
    result = await gateway.queue.wait(command_id, timeout=30)
    assert result.state == "cancelled", result
    await assert_eventually(
        lambda: not any(_alive(pid) for pid in pids), timeout=15, message="orphans survived"
    )


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
