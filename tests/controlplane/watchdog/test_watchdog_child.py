"""`superagent up` runs the watchdog as its own child process: restarted when it dies,
stopped with `up`, never left behind."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from tests.support.helpers import assert_eventually, free_port

pytestmark = pytest.mark.slow


def _watchdogs(parent: int) -> list[psutil.Process]:
    found = []
    with_children = psutil.Process(parent).children(recursive=True)
    for child in with_children:
        try:
            cmdline = child.cmdline()
        except psutil.Error:
            continue
        running = child.is_running() and child.status() != psutil.STATUS_ZOMBIE
        if "controlplane.cli" in cmdline and "watchdog" in cmdline and running:
            found.append(child)
    return found


@pytest.fixture
async def up(empty_database: str, tmp_path: Path) -> AsyncIterator[subprocess.Popen[bytes]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERAGENT_", "OPENAI_"))}
    env.update(
        {
            "DATABASE_URL": empty_database,
            "SUPERAGENT_STATE_DIR": str(tmp_path / "state"),
            "SUPERAGENT_HTTP__PORT": str(free_port()),
            "SUPERAGENT_GRPC__PORT": str(free_port()),
            "SUPERAGENT_WATCHDOG__INTERVAL_SECONDS": "1",
        }
    )
    with (tmp_path / "up.log").open("wb") as log:
        process = subprocess.Popen(  # noqa: ASYNC220 - started once, then only polled
            [sys.executable, "-m", "controlplane.cli", "up"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


async def test_up_supervises_a_watchdog_child_and_stops_it(
    up: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    log = tmp_path / "up.log"
    first = await assert_eventually(
        lambda: _watchdogs(up.pid), timeout=60, interval=0.2, message="a watchdog child runs"
    )
    assert len(first) == 1
    # It really runs its checks (its banner is printed once it is connected).
    await assert_eventually(
        lambda: "watchdog: checking every" in log.read_text(errors="replace"),
        timeout=60,
        message="the watchdog child started checking",
    )

    first[0].kill()  # kill -9: `up` notices and starts another
    second = await assert_eventually(
        lambda: [p for p in _watchdogs(up.pid) if p.pid != first[0].pid],
        timeout=30,
        interval=0.2,
        message="the watchdog came back",
    )
    assert len(_watchdogs(up.pid)) == 1
    output = log.read_text(errors="replace")
    assert "watchdog exited" in output, output[-3000:]
    assert "restarting in" in output, output[-3000:]

    up.send_signal(signal.SIGINT)
    await asyncio.to_thread(up.wait, 15)
    assert up.returncode == 0, log.read_text(errors="replace")[-3000:]
    # No orphan: the child is gone with its parent.
    await assert_eventually(
        lambda: not second[0].is_running() or second[0].status() == psutil.STATUS_ZOMBIE,
        timeout=5,
        message="the watchdog child outlived `up`",
    )
    assert "Traceback" not in log.read_text(errors="replace")
