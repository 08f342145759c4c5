"""Small test helpers shared by every test module."""

from __future__ import annotations

import asyncio
import inspect
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane import versions
from controlplane.ingest import admission
from controlplane.ingest.admission import Admission
from tests.support.database import asyncpg_transaction


async def assert_eventually(
    check: Callable[[], Any],
    *,
    timeout: float = 10.0,
    interval: float = 0.02,
    message: str = "",
) -> Any:
    """Poll ``check`` until it returns a truthy value (and return it) or time runs out.

    ``check`` may be sync or async; an ``AssertionError`` it raises counts as "not yet".
    On timeout the last value or assertion is reported, so failures say what was seen.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            result = check()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return result
            last = result
        except AssertionError as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"not true within {timeout}s{': ' + message if message else ''}; last: {last!r}"
            )
        await asyncio.sleep(interval)


# Ports for servers a test starts and must name before they listen. Asking the kernel for a
# free one (bind to 0, close, hand it on) once gave the same port twice in a row, to a
# replica's HTTP and gRPC listeners. So each xdist worker takes ports in turn from a range of
# its own, below the kernel's ephemeral range (32768 and up on Linux), which the kernel's own
# choices (outgoing connections, servers bound to port 0) never enter.
_PORTS_BASE = 20_000
_PORTS_PER_WORKER = 1_000
_MAX_WORKERS = 12
_next_port: list[int] = []


def _worker_ports() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) % _MAX_WORKERS if worker.isdigit() else 0
    start = _PORTS_BASE + index * _PORTS_PER_WORKER
    return range(start, start + _PORTS_PER_WORKER)


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on, never the same twice in one test process
    (until a worker's thousand come round again)."""
    ports = _worker_ports()
    if not _next_port:
        # Another run's servers may linger on the first ports: start somewhere else each time.
        _next_port.append(ports.start + os.getpid() % len(ports))
    for _ in range(len(ports)):
        port = _next_port[0]
        _next_port[0] = port + 1 if port + 1 < ports.stop else ports.start
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1}")


async def save_policy(
    db: async_sessionmaker[AsyncSession] | asyncpg.Pool | str, policy: Admission
) -> str:
    """Save ``policy`` as the ingest policy's next version (the first, in a fresh database);
    ``db``: the ``db`` or ``pool`` fixture, or the database's URL."""
    async with asyncpg_transaction(db) as conn:
        latest = await versions.latest(conn, versions.POLICY, admission.POLICY_NAME)
        saved = await versions.save(
            conn,
            versions.POLICY,
            name=admission.POLICY_NAME,
            body=policy.model_dump(mode="json"),
            base_id=latest.id if latest else None,
            author="test",
        )
        return saved.id


def run_cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``superagent ARGS`` as a user runs it, against ``database_url``."""
    return subprocess.run(
        [sys.executable, "-m", "controlplane.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DATABASE_URL": database_url},
        check=False,
    )
