"""`superagent up --device DIR`: one command to a control plane with this machine as its
device. A newcomer's first `/run` used to answer "no paired device": pairing the same
machine took three more commands, a copied fingerprint and an OS keyring."""

from __future__ import annotations

import asyncio
import os
import pty
import subprocess
import sys
import tomllib
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import psutil
import pytest

from tests.support.helpers import assert_eventually
from tests.support.up_process import Up, up_in

pytestmark = pytest.mark.slow


@pytest.fixture
def up(empty_database: str, tmp_path: Path) -> Iterator[Up]:
    with up_in(tmp_path, empty_database) as runner:
        yield runner


def _daemons() -> list[psutil.Process]:
    """Running `endpointd run` processes started by an `up` (they carry --parent-pid)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if "endpointd" in cmdline and "run" in cmdline and "--parent-pid" in cmdline:
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except psutil.Error:
                continue
    return found


def _children_of(up: Up) -> list[psutil.Process]:
    assert up.process is not None
    pid = up.process.pid
    return [p for p in _daemons() if str(pid) in p.info["cmdline"]]


async def _devices(database_url: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(database_url)
    try:
        if await conn.fetchval("SELECT to_regclass('devices')") is None:
            return []  # `up` has not migrated the database yet
        return list(
            await conn.fetch(
                "SELECT id, name, owner, connected_replica, last_seen_at FROM devices "
                "WHERE revoked_at IS NULL"
            )
        )
    finally:
        await conn.close()


def _online(database_url: str, name: str) -> Callable[[], Awaitable[bool]]:
    """Whether the device connected (said Hello) since this check was made."""
    since = datetime.now(UTC)

    async def check() -> bool:
        return any(
            r["name"] == name
            and r["connected_replica"] is not None
            and r["last_seen_at"] is not None
            and r["last_seen_at"] > since
            for r in await _devices(database_url)
        )

    return check


async def test_up_with_a_device_pairs_this_machine_once_and_supervises_it(
    up: Up, empty_database: str, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    up.start("--device", str(src), "--device-name", "laptop")
    await assert_eventually(_online(empty_database, "laptop"), timeout=90)
    assert "This machine is now device 'laptop'" in up.output()

    # The admin owns it, so the admin's `/run laptop …` is authorized without more steps.
    (device,) = await _devices(empty_database)
    assert device["owner"] == "web:admin"
    home = tmp_path / "state" / "device"
    policy = tomllib.loads((home / "config" / "policy.toml").read_text())
    assert [Path(r) for r in policy["allowed_roots"]] == [src.resolve()]
    # Its commands reach the network only through endpointd's proxy, to listed hosts.
    assert policy["network"] == "proxy"
    # No keyring on this machine: the key is a 0600 file in the device's own config dir.
    key = home / "config" / "device.key"
    assert key.stat().st_mode & 0o777 == 0o600
    assert not (tmp_path / "elsewhere").exists(), "touched the user's own endpointd"

    # Ctrl-C stops the daemon with `up`.
    (daemon,) = _children_of(up)
    up.stop()
    assert up.process is not None
    assert up.process.returncode == 0, up.output()
    await asyncio.to_thread(daemon.wait, 10)

    # The next `up`, even without --device, starts the same device: no second pairing.
    up.start()
    await assert_eventually(_online(empty_database, "laptop"), timeout=90)
    assert [r["name"] for r in await _devices(empty_database)] == ["laptop"]
    assert "This machine is device 'laptop', working in" in up.output()

    # A SIGKILLed `up` leaves no daemon behind (it would be a second one next time).
    (daemon,) = _children_of(up)
    assert up.process is not None
    up.process.kill()
    up.process.wait(10)
    await asyncio.to_thread(daemon.wait, 15)
    assert "Traceback" not in up.output()


async def test_up_without_a_device_prints_the_next_steps(
    up: Up, empty_database: str, tmp_path: Path
) -> None:
    up.start()

    async def printed() -> bool:
        return "Next steps:" in up.output()

    await assert_eventually(printed, timeout=60)
    await asyncio.sleep(1.0)  # the rest of the lines
    text = up.output()
    assert "superagent up --device ~/src" in text
    assert "superagent devices pair --name NAME" in text
    assert 'superagent say "/run NAME echo hello"' in text
    assert "/console" in text
    assert await _devices(empty_database) == []
    # Where its state and its log file are, for whoever closes this terminal.
    log = tmp_path / "state" / "logs" / "superagent.log"
    assert f"State: {tmp_path / 'state'} · log: {log}" in text
    assert "controlplane.runtime" in log.read_text()


async def test_a_first_interactive_run_asks_for_the_directory(
    up: Up, empty_database: str, tmp_path: Path
) -> None:
    src = tmp_path / "code"
    src.mkdir()
    leader, follower = pty.openpty()
    try:
        up.start("--device-name", "devbox", stdin=follower)
        os.write(leader, f"{src}\n".encode())
        await assert_eventually(_online(empty_database, "devbox"), timeout=90)
    finally:
        os.close(follower)
        os.close(leader)
    assert "No device is paired yet" in up.output()


def test_a_device_directory_that_does_not_exist_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "nope"
    result = subprocess.run(
        [sys.executable, "-m", "controlplane.cli", "up", "--device", str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SUPERAGENT_STATE_DIR": str(tmp_path / "state")},
    )
    assert result.returncode == 2
    assert f"{missing} is not a directory" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "state").exists()
