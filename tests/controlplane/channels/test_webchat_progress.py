"""What a chat message was promised, told by the chat protocol, and `superagent say` waiting
for it: a ticket's first report, the stdout/stderr split, ``--wait``, ``--follow``.

The agent's side is played by the test, recording what the router and workers record (a
ticket with a mandate from the message, a worker's report, replies through the outbox): the
frames must follow from those records, never from the replies' text. ``/run`` end to end,
with a real endpointd, is in ``tests/controlplane/cli/test_say.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import asyncpg
from websockets.asyncio.client import ClientConnection

from controlplane.ingest.intake import Ingested
from controlplane.tickets import reports
from tests.controlplane.channels.test_webchat import (
    Served,
    cli_env,
    connect,
    console_policy,
    ready,
    recv,
    reply,
    serving,
    superagent_say,
    web_triggers,
)
from tests.support.cli_output import read_to_end
from tests.support.helpers import assert_eventually
from tests.support.worker_harness import file_ticket

__all__ = ["console_policy"]  # the fixture, used by name


async def say_tracked(ws: ClientConnection, text: str, client_id: str) -> None:
    await ws.send(
        json.dumps(
            {"type": "say", "thread": None, "text": text, "client_id": client_id, "track": True}
        )
    )


async def frames_until(
    ws: ClientConnection, done: Any, timeout: float = 20.0
) -> list[dict[str, Any]]:
    """Frames up to and including the first for which ``done(frame)`` holds."""
    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout):
        while True:
            frame = await recv(ws, timeout)
            seen.append(frame)
            if done(frame):
                return seen


async def said(pool: asyncpg.Pool, text: str) -> asyncpg.Record:
    async def row() -> asyncpg.Record | None:
        rows = [r for r in await web_triggers(pool) if r["text"] == text]
        return rows[0] if rows else None

    found = await assert_eventually(row, timeout=30, message=f"trigger {text!r}")
    assert isinstance(found, asyncpg.Record)
    return found


async def open_ticket(pool: asyncpg.Pool, trigger: asyncpg.Record) -> str:
    """What the router records when it files a ticket on the message (and routes it)."""
    request = Ingested(trigger["id"], trigger["thread_id"], False, "explicit", "", "router")
    return await file_ticket(pool, request, None, title="fix the flaky test")


async def first_report(pool: asyncpg.Pool, ticket_id: str) -> None:
    """The worker's report, and the router's turn over it done (its reply follows)."""
    await reports.finish(pool, ticket_id, None, {"status": "ready", "summary": "fixed"})
    await pool.execute(
        "UPDATE triggers SET routed_at = now() WHERE id = "
        "(SELECT trigger_id FROM reports WHERE ticket_id = $1)",
        ticket_id,
    )


async def test_a_tracked_message_hears_of_its_ticket_until_the_first_report_arrives(
    pool: asyncpg.Pool, database_url: str, console_policy: None
) -> None:
    async with (
        serving(pool, database_url) as served,
        connect(served.ws_url) as alice,
        connect(served.ws_url) as page,
    ):
        assert served.adapter is not None
        await ready(alice)
        await ready(page)
        await say_tracked(alice, "Fix the flaky test", "client-track-0001")
        accepted = await recv(alice)
        assert accepted["type"] == "accepted", accepted
        thread, trigger_id = accepted["thread"], accepted["trigger"]
        await page.send(json.dumps({"type": "watch", "thread": thread}))

        # Not handled yet: nothing is promised, and the router has not decided.
        first = await frames_until(alice, lambda f: f["type"] == "progress")
        progress = first[-1]
        assert (progress["trigger"], progress["thread"]) == (trigger_id, thread)
        assert (progress["handled"], progress["pending"], progress["settled"]) == (
            False,
            [],
            False,
        )

        ticket_id = await open_ticket(pool, await said(pool, "Fix the flaky test"))
        opened = await reply(pool, served.channels, thread, f"On it: {ticket_id}.")
        seen = await frames_until(alice, lambda f: f.get("id") == opened)
        told = [f for f in seen if f["type"] == "progress"]
        if not told:
            # Sent with the reply that announces it (right after it, in the same read), so a
            # client that stops when no more replies come never stops before hearing of it.
            told = [await recv(alice)]
        [promised] = told
        assert promised["handled"] is True
        assert promised["pending"] == [
            {"kind": "ticket", "id": ticket_id, "see": f"superagent tickets show {ticket_id}"}
        ]
        assert (promised["arrived"], promised["settled"]) == ([], False)

        await first_report(pool, ticket_id)
        done = await reply(pool, served.channels, thread, f"{ticket_id} is fixed.")
        seen = await frames_until(alice, lambda f: f["type"] == "progress" and f["settled"])
        kept = seen[-1]
        assert kept["pending"] == []
        assert [(a["kind"], a["id"]) for a in kept["arrived"]] == [("ticket", ticket_id)]
        if done not in [f.get("id") for f in seen]:
            await frames_until(alice, lambda f: f.get("id") == done)

        # The page did not ask: it gets the messages, never a progress frame (the console's
        # chat page is such a client).
        page_frames = await frames_until(page, lambda f: f.get("id") == done)
        assert {f["type"] for f in page_frames} == {"message"}


async def test_a_ticket_that_ends_without_a_report_is_not_waited_for(
    pool: asyncpg.Pool, database_url: str, console_policy: None
) -> None:
    async with serving(pool, database_url) as served, connect(served.ws_url) as alice:
        await ready(alice)
        await say_tracked(alice, "Fix it", "client-track-0002")
        thread = (await recv(alice))["thread"]
        ticket_id = await open_ticket(pool, await said(pool, "Fix it"))
        await reply(pool, served.channels, thread, "On it.")
        await frames_until(alice, lambda f: f["type"] == "progress" and f["pending"])
        await pool.execute("UPDATE tickets SET state = 'stopped' WHERE id = $1", ticket_id)
        await reply(pool, served.channels, thread, "Stopped, as you asked.")
        seen = await frames_until(alice, lambda f: f["type"] == "progress" and f["settled"])
        assert seen[-1]["pending"] == []


# -- superagent say ---------------------------------------------------------------------


async def _ticket_reported_late(pool: asyncpg.Pool, served: Served, last: str) -> str:
    """The agent's side of "Fix the flaky test": a ticket and a reply at once, then, 2.5 s
    later (longer than the pause after which a client with no promise to wait for stops,
    and two ticks of a terminal's status line), its first report and the reply ``last``.
    Returns the ticket."""
    trigger = await said(pool, "Fix the flaky test")
    ticket_id = await open_ticket(pool, trigger)
    await reply(pool, served.channels, trigger["thread"], "Opened a ticket.")
    await asyncio.sleep(2.5)
    await first_report(pool, ticket_id)
    await reply(pool, served.channels, trigger["thread"], last)
    return ticket_id


async def test_say_waits_for_the_tickets_first_report_and_keeps_stdout_to_the_replies(
    pool: asyncpg.Pool, database_url: str, console_policy: None
) -> None:
    async with serving(pool, database_url) as served:
        playing = asyncio.create_task(
            _ticket_reported_late(pool, served, "Fixed:\nthe test is stable.\n")
        )
        code, out, err = await superagent_say("--url", served.url, "Fix the flaky test")
        ticket_id = await playing
        assert code == 0, err
        # What it waits for, said once on stderr while it waits (not a terminal: no clock).
        waited = [line for line in err.splitlines() if line.startswith("waiting for ")]
        assert len(waited) == 1, err
        assert ticket_id in waited[0], err
        # Exactly the replies, each ending with one newline; nothing else.
        assert out == "Opened a ticket.\nFixed:\nthe test is stable.\n"
        [row] = await web_triggers(pool)
        lines = err.splitlines()
        conversation = [line for line in lines if line.startswith("conversation ")]
        assert conversation == [
            f"conversation {row['thread']} (continue it: superagent say --conversation "
            f"{row['thread']} TEXT)"
        ], err
        assert "Traceback" not in err


async def test_on_a_terminal_say_keeps_one_ticking_status_line_and_clears_it_for_replies(
    pool: asyncpg.Pool, database_url: str, console_policy: None
) -> None:
    async with serving(pool, database_url) as served:
        master, slave = os.openpty()
        playing = asyncio.create_task(_ticket_reported_late(pool, served, "Fixed."))
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "controlplane.cli",
            "say",
            "--url",
            served.url,
            "Fix the flaky test",
            stdout=asyncio.subprocess.PIPE,
            stderr=slave,
            env=cli_env(),
        )
        os.close(slave)
        shown = asyncio.create_task(asyncio.to_thread(read_to_end, master))
        async with asyncio.timeout(60):
            out, _ = await process.communicate()
        terminal = (await shown).decode(errors="replace")
        ticket_id = await playing
        assert process.returncode == 0, terminal
        assert out.decode() == "Opened a ticket.\nFixed.\n"  # stdout: the replies only
        lines = [part for part in terminal.split("\r\x1b[K") if part.startswith("waiting for ")]
        assert any(ticket_id in line for line in lines), terminal
        clock = {line.split(": ")[-1].split("s of")[0] for line in lines}
        assert len(clock) >= 2, terminal  # it ticked
        # Cleared at the end: no status line left on the terminal.
        assert not terminal.split("\r\x1b[K")[-1].startswith("waiting for"), terminal


async def test_say_says_what_is_still_pending_when_the_wait_runs_out(
    pool: asyncpg.Pool, database_url: str, console_policy: None
) -> None:
    async with serving(pool, database_url) as served:

        async def agent() -> str:
            trigger = await said(pool, "Fix the flaky test")
            ticket_id = await open_ticket(pool, trigger)
            await reply(pool, served.channels, trigger["thread"], "Opened a ticket.")
            return ticket_id

        playing = asyncio.create_task(agent())
        code, out, err = await superagent_say(
            "--url", served.url, "--wait", "4", "Fix the flaky test"
        )
        ticket_id = await playing
        assert code == 3, (out, err)
        assert out == "Opened a ticket.\n"
        [row] = await web_triggers(pool)
        assert f"superagent tickets show {ticket_id}" in err
        assert f"superagent say --follow --conversation {row['thread']}" in err
        assert "Traceback" not in err

        # --wait 0: recorded, and back at once.
        code, out, err = await superagent_say("--url", served.url, "--wait", "0", "later")
        assert (code, out) == (0, ""), err
        assert "conversation chat_" in err


async def test_say_follow_streams_later_replies_until_ctrl_c(
    pool: asyncpg.Pool, database_url: str, console_policy: None
) -> None:
    async with serving(pool, database_url) as served:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "controlplane.cli",
            "say",
            "--url",
            served.url,
            "--follow",
            "hello",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=cli_env(),
        )
        assert process.stdout is not None
        try:
            trigger = await said(pool, "hello")
            await reply(pool, served.channels, trigger["thread"], "Hi.")
            async with asyncio.timeout(20):
                assert await process.stdout.readline() == b"Hi.\n"
            # Said on the conversation later, by someone else (the console): still streamed.
            await reply(pool, served.channels, trigger["thread"], "And one more thing.")
            async with asyncio.timeout(20):
                assert await process.stdout.readline() == b"And one more thing.\n"
            # What the follower's signals were, for a failure to show (blocked, ignored).
            status = await asyncio.to_thread(Path(f"/proc/{process.pid}/status").read_text)
            signals = [line for line in status.splitlines() if line.startswith("Sig")]
            process.send_signal(signal.SIGINT)
            try:
                async with asyncio.timeout(20):
                    rest, err = await process.communicate()
            except TimeoutError:
                raise AssertionError(f"say --follow did not end on Ctrl-C: {signals}") from None
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        assert process.returncode == 0, err.decode()
        assert rest == b""
        assert b"Traceback" not in err
        assert b"conversation chat_" in err

        # Following a conversation later, without saying anything: the replies to its
        # latest message, then whatever comes.
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "controlplane.cli",
            "say",
            "--url",
            served.url,
            "--follow",
            "--conversation",
            trigger["thread"],
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=cli_env(),
        )
        assert process.stdout is not None
        try:
            async with asyncio.timeout(20):
                assert await process.stdout.readline() == b"Hi.\n"
                assert await process.stdout.readline() == b"And one more thing.\n"
            process.send_signal(signal.SIGINT)
            async with asyncio.timeout(20):
                rest, err = await process.communicate()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        assert process.returncode == 0, err.decode()
        assert b"Traceback" not in err


async def test_say_help_teaches_waiting_following_and_continuing() -> None:
    code, out, _ = await superagent_say("--help")
    assert code == 0
    for example in (
        "superagent say --wait 600",
        "superagent say --follow",
        "superagent say --conversation chat_",
    ):
        assert example in out, out
    # The exit statuses, as one line each would wrap: the words, not the layout.
    assert "3 when something promised did not arrive within --wait" in " ".join(out.split())
