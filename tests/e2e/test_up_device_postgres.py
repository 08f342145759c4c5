"""The finding's whole chain: `superagent up --device` on its embedded Postgres, and a
command sent to that device trying the database's socket with psql, as the superuser and
as the application's role (with its password, should the command be able to read it).
Neither runs a program: the server admits no superuser, and the role may run none."""

from __future__ import annotations

import shlex
import urllib.parse
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest

from controlplane.db import embedded_process
from controlplane.db.pool import create_pool
from controlplane.gateway import specs
from controlplane.gateway.queue import CommandQueue
from tests.support.helpers import assert_eventually
from tests.support.up_process import Up, up_in

pytestmark = pytest.mark.slow


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    with up_in(tmp_path, None) as runner:
        yield runner


def _app_url(state: Path) -> str | None:
    """The application's URL, as the test (the owner) can read it; None before the start."""
    try:
        pid_lines = (state / "postgres" / "postmaster.pid").read_text().splitlines()
    except FileNotFoundError:
        return None
    if len(pid_lines) < 8 or pid_lines[7].strip() != "ready":
        return None
    host = urllib.parse.quote(pid_lines[4].strip(), safe="/")
    where = f"?host={host}&port={pid_lines[3].strip()}"
    password = state / "postgres-password"
    if not password.exists():  # as releases before this one ran it: the superuser, trust
        return f"postgresql://postgres:@/postgres{where}"
    return f"postgresql://superagent:{password.read_text().strip()}@/superagent{where}"


async def test_a_device_command_on_the_embedded_postgres_socket_runs_no_program(
    up: Up, tmp_path: Path
) -> None:
    psql = embedded_process.bin_dir() / "psql"
    state, src = tmp_path / "state", tmp_path / "src"
    src.mkdir()
    canary = tmp_path / "ran-unconfined"
    up.start("--device", str(src), "--device-name", "laptop")

    async def online() -> bool:
        url = _app_url(state)
        if url is None:
            return False
        conn = await asyncpg.connect(url)
        try:
            if await conn.fetchval("SELECT to_regclass('devices')") is None:
                return False
            return bool(
                await conn.fetchval(
                    "SELECT count(*) FROM devices WHERE name = 'laptop' "
                    "AND connected_replica IS NOT NULL"
                )
            )
        finally:
            await conn.close()

    await assert_eventually(online, timeout=120)
    url = _app_url(state)
    assert url is not None
    socket_dir = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["host"][0]
    copy = f"COPY (SELECT 1) TO PROGRAM 'touch {canary}'"
    run = f"{shlex.quote(str(psql))} -w -h {shlex.quote(socket_dir)}"
    script = "; ".join(
        [
            f'{run} -U postgres -d superagent -c "{copy}"; echo "superuser: $?"',
            f'{run} -U postgres -d postgres -c "{copy}"; echo "superuser-postgres: $?"',
            # Should the command read the role's password (the state directory), still no
            # program: the role may run none.
            f"PGPASSWORD=$(cat {shlex.quote(str(state / 'postgres-password'))}) "
            f'{run} -U superagent -d superagent -c "{copy}"; echo "role: $?"',
        ]
    )
    pool = await create_pool(url, size=2)
    queue = CommandQueue(pool, ttl=timedelta(minutes=5))
    try:
        command_id = await queue.submit(
            "laptop", specs.Exec(["sh", "-c", script], cwd=str(src), timeout_seconds=60)
        )
        result = await queue.wait(command_id, timeout=90)
        output = (await queue.output(command_id)).decode(errors="replace")
    finally:
        await queue.close()
        await pool.close()
    assert result.state == "finished", (result, output)
    assert "superuser: 2" in output, output  # psql: could not connect
    assert "superuser-postgres: 2" in output, output
    assert "COPY 1" not in output, output
    assert "role: 0" not in output, output
    assert not canary.exists(), output
