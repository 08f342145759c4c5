"""Leader election by a lease row: one leader, a clean hand-over, and a take-over after a kill."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import asyncpg

from controlplane.leadership import ROUTER_LEASE, Leadership, claim, current
from tests.support.helpers import assert_eventually


async def test_one_holder_at_a_time_until_the_lease_expires(pool: asyncpg.Pool) -> None:
    # Held for long enough that b's claim comes well within it however slow the machine;
    # the renewal then shortens it, so that it runs out during the sleep below.
    assert await claim(pool, "test", "a", 30)
    assert not await claim(pool, "test", "b", 0.5)
    assert await claim(pool, "test", "a", 0.5)  # renewed
    before = await current(pool, "test")
    assert before is not None
    assert before.holder == "a"
    await asyncio.sleep(0.7)
    assert await claim(pool, "test", "b", 5)  # expired: taken over
    after = await current(pool, "test")
    assert after is not None
    assert after.holder == "b"
    assert after.acquired_at > before.acquired_at


async def test_a_leader_that_stops_hands_over_at_once(pool: asyncpg.Pool) -> None:
    first = Leadership(pool, "first", lease_seconds=30, renew_seconds=0.2)
    second = Leadership(pool, "second", lease_seconds=30, renew_seconds=0.2)
    await first.start()
    await asyncio.wait_for(first.gained.wait(), 5)
    await second.start()
    try:
        await asyncio.sleep(0.5)
        assert first.is_leader
        assert not second.is_leader
        await first.stop()
        assert not first.is_leader
        # Well before the 30 s lease would have run out.
        await asyncio.wait_for(second.gained.wait(), 5)
        lease = await current(pool, ROUTER_LEASE)
        assert lease is not None
        assert lease.holder == "second"
    finally:
        await first.stop()
        await second.stop()


def _serve(database_url: str, state: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "SUPERAGENT_STATE_DIR": str(state),
        "SUPERAGENT_GRPC__PORT": "0",
        "SUPERAGENT_HTTP__PORT": "0",
        "SUPERAGENT_ROUTER__LEASE_SECONDS": "3",
        "SUPERAGENT_ROUTER__RENEW_SECONDS": "1",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "controlplane.cli", "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _status(database_url: str) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-m", "controlplane.cli", "status", "--json"],
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert isinstance(status, dict)
    return status


async def test_killing_the_leader_hands_leadership_to_another_replica(
    pool: asyncpg.Pool, database_url: str, tmp_path: Path
) -> None:
    replicas = [_serve(database_url, tmp_path / name) for name in ("a", "b")]
    try:

        async def led() -> bool:
            lease = await current(pool, ROUTER_LEASE)
            return lease is not None and not lease.expired

        await assert_eventually(led, timeout=60, interval=0.2)
        lease = await current(pool, ROUTER_LEASE)
        assert lease is not None
        status = _status(database_url)
        assert status["router_leader"] == lease.holder
        # The holder names its process (host:pid:random); both replicas are ours.
        leader_pid = int(lease.holder.split(":")[1])
        assert leader_pid in {p.pid for p in replicas}
        leader = next(p for p in replicas if p.pid == leader_pid)
        killed_at = time.monotonic()
        leader.send_signal(signal.SIGKILL)
        leader.wait(10)

        async def taken_over() -> bool:
            now = await current(pool, ROUTER_LEASE)
            return now is not None and now.holder != lease.holder and not now.expired

        await assert_eventually(taken_over, timeout=20, interval=0.2)
        # Lease 3 s + one renewal interval of 1 s, with room for a slow machine.
        assert time.monotonic() - killed_at < 10
        new = await current(pool, ROUTER_LEASE)
        assert new is not None
        assert _status(database_url)["router_leader"] == new.holder
        survivor = next(p for p in replicas if p.pid != leader_pid)
        assert int(new.holder.split(":")[1]) == survivor.pid
    finally:
        for replica in replicas:
            if replica.poll() is None:
                replica.send_signal(signal.SIGTERM)
        for replica in replicas:
            try:
                replica.wait(15)
            except subprocess.TimeoutExpired:
                replica.kill()
