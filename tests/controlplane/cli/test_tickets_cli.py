"""``superagent tickets``: list, show, retry, reroute and stop, as a person runs them."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import asyncpg

from controlplane.tickets import reports
from tests.support.cli_output import one_line_error
from tests.support.worker_harness import local_device, ticket


def _cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controlplane.cli", "tickets", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DATABASE_URL": database_url},
    )


async def test_tickets_are_listed_shown_retried_rerouted_and_stopped(
    pool: asyncpg.Pool, database_url: str, tmp_path: Path
) -> None:
    device = await local_device(pool, tmp_path)
    other = await local_device(pool, tmp_path)
    ticket_id, _ = await ticket(pool, device, title="fix the parser")
    await reports.finish(
        pool, ticket_id, None, {"status": "question", "summary": "stuck", "question": "which?"}
    )

    async def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(_cli, database_url, *args)

    listed = await cli("list")
    assert listed.returncode == 0, listed.stderr
    line = next(line for line in listed.stdout.splitlines() if line.startswith(ticket_id))
    assert "waiting_human (question)" in line
    assert device.name in line
    assert "fix the parser" in line
    shown = await cli("show", ticket_id, "--json")
    detail = json.loads(shown.stdout)
    assert detail["state"] == "waiting_human"
    assert detail["reports"][0]["question"] == "which?"
    assert detail["initiator"] == "alice"

    status = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "controlplane.cli", "status"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DATABASE_URL": database_url},
    )
    waiting = next(line for line in status.stdout.splitlines() if line.startswith("tickets:"))
    assert "waiting for a device" in waiting
    assert int(waiting.split(",")[-1].split()[0]) >= 1  # ours waits for people
    retried = await cli("retry", ticket_id, "--note", "use the v2 grammar")
    assert retried.returncode == 0, retried.stderr
    event = await pool.fetchval(
        "SELECT text FROM worker_events WHERE ticket_id = $1 AND kind = 'retry'", ticket_id
    )
    assert "use the v2 grammar" in event

    assert "no paired device 'nowhere'" in one_line_error(
        await cli("reroute", ticket_id, "nowhere")
    )
    moved = await cli("reroute", ticket_id, other.name)
    assert moved.returncode == 0, moved.stderr
    assert await pool.fetchval("SELECT device_id FROM tickets WHERE id = $1", ticket_id) == other.id

    stopped = await cli("stop", ticket_id)
    assert f"stopped {ticket_id}" in stopped.stdout
    assert await pool.fetchval("SELECT state FROM tickets WHERE id = $1", ticket_id) == "stopped"
    assert "was already stopped" in (await cli("stop", ticket_id)).stdout
    assert "only a ticket waiting for people retries" in one_line_error(
        await cli("retry", ticket_id)
    )
    assert "no ticket tkt_000000000000" in one_line_error(await cli("show", "tkt_000000000000"))
    assert ticket_id not in (await cli("list")).stdout
    assert ticket_id in (await cli("list", "--all")).stdout
