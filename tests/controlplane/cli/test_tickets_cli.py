"""``superagent tickets``: list, show (and its worker's transcript), retry, reroute and stop,
as a person runs them."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import asyncpg

from controlplane.gateway.queue import CommandQueue
from controlplane.tickets import reports
from tests.fakes.openai_server import FakeOpenAIServer, Reply, ToolCall
from tests.support.cli_output import one_line_error
from tests.support.helpers import assert_eventually
from tests.support.worker_harness import (  # noqa: F401 - fixtures
    LocalDevice,
    device_fixture,
    dsn_fixture,
    local_device,
    queue_fixture,
    report_reply,
    state_is,
    ticket,
    workers_running,
)


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


async def test_the_transcript_prints_each_round_capped_and_recall_prints_it_whole(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    database_url: str,
    tmp_path: Path,
) -> None:
    ticket_id, _ = await ticket(pool, device, title="count to forty", workdir=str(tmp_path))
    # The output ends with an escape sequence that would clear the reader's terminal.
    command = r"seq 1 40; printf '\033[2Jcleared'"
    fake_llm.script(
        Reply(content="Counting first.", tool_calls=[ToolCall("shell", {"command": command})]),
        report_reply("ready", "counted to forty"),
    )
    async with workers_running(pool, queue, fake_llm, dsn):
        await assert_eventually(lambda: state_is(pool, ticket_id, "completed"), timeout=30)
    other_id, _ = await ticket(pool, None, title="nothing yet")  # no worker ran it

    async def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(_cli, database_url, *args)

    helped = await cli("show", "--help")
    assert "--transcript" in helped.stdout
    assert "superagent tickets recall TICKET MSG" in " ".join(helped.stdout.split())

    shown = await cli("show", ticket_id, "--transcript")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"{ticket_id}: count to forty  (completed)"
    assert re.fullmatch(
        r"round 1  asg_\w+  new, regular slot  2 model calls  ready  [-\d]+ [:\d]+ → [:\d]+ UTC",
        lines[2],
    ), lines[2]
    at = r"  \d\d:\d\d:\d\d  "
    body = " " * 12
    headings = [line for line in lines if re.match(at, line)]
    assert [re.sub(at, "", line, count=1) for line in headings] == [
        "control plane: brief",
        "worker",
        "worker → shell  " + json.dumps({"command": command}, separators=(",", ":")),
        "← shell",
        'worker → report  {"status":"ready","summary":"counted to forty"}',
        "← report",
    ]
    assert f"{body}Counting first." in lines
    result = lines[lines.index(headings[3]) + 1 : lines.index(headings[4])]
    assert result[2:] == [
        f"{body}exit_code: 0",
        f"{body}output:",
        *(f"{body}{n}" for n in range(1, 9)),
        result[-1],
    ]
    recall = re.fullmatch(rf"{body}… 33 more lines \(recall (msg_\w+)\)", result[-1])
    assert recall, result[-1]
    assert "\x1b" not in shown.stdout

    whole = await cli("recall", ticket_id, recall[1])
    assert whole.returncode == 0, whole.stderr
    output = whole.stdout.split("output:\n", 1)[1]
    # Shown, never acted on: the escape arrives as text.
    assert output == "\n".join(map(str, range(1, 41))) + "\n\\x1b[2Jcleared\n"

    as_json = json.loads((await cli("show", ticket_id, "--transcript", "--json")).stdout)
    (round_,) = as_json["rounds"]
    assert [entry["kind"] for entry in round_["entries"]] == [
        "brief",
        "said",
        "call",
        "result",
        "call",
        "result",
    ]
    assert round_["entries"][3]["more"] == "33 more lines"
    assert round_["entries"][3]["recall"] == recall[1]

    nothing = await cli("show", other_id, "--transcript")
    assert nothing.stdout.splitlines()[-1] == "No rounds yet."
    assert "not a message id" in one_line_error(await cli("recall", ticket_id, "trg_nope"))
    assert f"no message {recall[1]} in the worker sessions of {other_id}" in one_line_error(
        await cli("recall", other_id, recall[1])
    )
    assert "no ticket tkt_000000000000" in one_line_error(
        await cli("show", "tkt_000000000000", "--transcript")
    )
