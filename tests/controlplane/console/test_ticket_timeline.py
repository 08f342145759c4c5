"""The ticket page's timeline (controlplane/workers/timeline.py): what a worker was told,
said, called and got back, round by round.

A real worker round (``WorkerService`` over the fake model, ``LocalDevice`` running its
commands for real) writes the conversation; a real replica (`superagent serve`) serves the
console, and real headless Chromium shows a finished round, then a running round whose new
message and tool call arrive without a reload. In process: how the read model splits a
session into rounds and caps its texts, and that nobody without the admin's sign-in reads
a transcript through its endpoints, nor one ticket's message through another's address.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path

import asyncpg
from playwright.async_api import expect

from controlplane.console.hub import ConsoleHub, Watcher
from controlplane.gateway.queue import CommandQueue
from controlplane.tickets import slots
from controlplane.workers import timeline
from controlplane.workers.session import Compaction, WorkerSession
from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer, Reply, ToolCall
from tests.support.console_browser import chromium, screenshot
from tests.support.console_replica import (  # noqa: F401 - the replica fixture
    TOKEN,
    Replica,
    in_process,
    replica_fixture,
    sign_in,
    up,
)
from tests.support.helpers import assert_eventually
from tests.support.worker_harness import (  # noqa: F401 - fixtures
    LocalDevice,
    device_fixture,
    dsn_fixture,
    queue_fixture,
    report_reply,
    state_is,
    ticket,
    workers_running,
)


def _shell(command: str, content: str | None = None) -> Reply:
    return Reply(content=content, tool_calls=[ToolCall("shell", {"command": command})])


def _gated(gate: threading.Event, reply: Reply) -> Callable[[ChatRequest], Awaitable[Reply]]:
    """The model thinks until the test lets it answer; its round runs meanwhile."""

    async def answer(_: ChatRequest) -> Reply:
        await asyncio.to_thread(gate.wait, 60)
        return reply

    return answer


async def test_the_ticket_page_shows_a_finished_round_and_a_running_one_live(
    replica: Replica,
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    url = await up(replica)
    done, _ = await ticket(pool, device, title="count to forty", workdir=str(tmp_path))
    fake_llm.script(
        _shell("seq 1 40", "Counting first."),
        report_reply("ready", "counted to forty"),
    )
    first, second = threading.Event(), threading.Event()
    try:
        async with workers_running(pool, queue, fake_llm, dsn):
            await assert_eventually(lambda: state_is(pool, done, "completed"), timeout=30)
            async with chromium() as browser:
                context = await browser.new_context(viewport={"width": 1280, "height": 900})
                page = await context.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda error: errors.append(str(error)))
                await sign_in(page, url, f"/console/tickets/{done}")

                # The finished round: the brief, what the worker said, its calls with their
                # arguments, and their results, capped with the whole text one link away.
                finished = page.locator("details.round")
                await expect(finished).to_have_count(1)
                await expect(finished.locator("summary")).to_contain_text("Round 1")
                await expect(finished.locator("summary")).to_contain_text("ready")
                entries = finished.locator("li.entry")
                await expect(entries.first).to_contain_text("control plane: brief")
                await expect(entries.first).to_contain_text(done)
                said = finished.locator("li.entry.said")
                await expect(said.locator(".heading")).to_contain_text("worker")
                await expect(said.locator("pre")).to_have_text("Counting first.")
                call = finished.locator("li.entry.call").first
                await expect(call).to_contain_text("worker → shell")
                await expect(call.locator("code.args")).to_have_text('{"command":"seq 1 40"}')
                result = finished.locator("li.entry.result").first
                await expect(result).to_contain_text("← shell")
                await expect(result.locator(".more")).to_contain_text(
                    "… 32 more lines (recall msg_"
                )
                capped = await result.locator("pre").text_content()
                assert capped is not None
                assert "exit_code: 0" in capped.splitlines()
                assert capped.split("output:\n")[1] == "\n".join(map(str, range(1, 9)))
                report = finished.locator("li.entry.call").nth(1)
                await expect(report).to_contain_text("worker → report")
                await expect(report).to_contain_text('"summary":"counted to forty"')
                href = await result.locator(".more a").get_attribute("href")
                whole = await page.request.get(f"{url}{href}")
                assert whole.status == 200
                assert whole.headers["content-type"].startswith("text/plain")
                assert whole.headers["x-content-type-options"] == "nosniff"
                assert (await whole.text()).endswith(
                    "output:\n" + "\n".join(map(str, range(1, 41)))
                )
                assert "null" not in await page.locator("#view").inner_text()
                await screenshot(page, "ticket-timeline")

                # A running round: what the worker says and calls next arrives live.
                running, _ = await ticket(pool, device, title="two steps", workdir=str(tmp_path))
                fake_llm.script(
                    _shell("echo first step"),
                    _gated(first, _shell("echo second step", "Now the second step.")),
                    _gated(second, report_reply("ready", "both steps done")),
                )
                await assert_eventually(lambda: state_is(pool, running, "running"), timeout=30)
                await page.goto(f"{url}/console/tickets/{running}")
                live = page.locator("details.round")
                await expect(live.locator("summary")).to_contain_text("running")
                await expect(live).to_have_attribute("open", "")
                await expect(live.locator("li.entry.result")).to_contain_text("first step")
                await expect(live).not_to_contain_text("Now the second step.")
                await page.evaluate("window.timelineMark = 'not reloaded'")
                first.set()
                await expect(live.locator("li.entry.said")).to_contain_text(
                    "Now the second step.", timeout=15_000
                )
                await expect(
                    live.locator("li.entry.call").nth(1).locator("code.args")
                ).to_have_text('{"command":"echo second step"}', timeout=15_000)
                await expect(live.locator("li.entry.result").nth(1)).to_contain_text(
                    "output:\nsecond step", timeout=15_000
                )
                await screenshot(page, "ticket-timeline-running")
                second.set()
                await expect(live.locator("summary")).to_contain_text("ready", timeout=15_000)
                await expect(live.locator("li.entry.call").last).to_contain_text("worker → report")
                assert await page.evaluate("window.timelineMark") == "not reloaded"
                await context.close()
            assert errors == [], "the page's script failed"
    finally:
        first.set()
        second.set()


# -- the read model, in process ------------------------------------------------------------


async def _round(pool: asyncpg.Pool, ticket_id: str, *, states: tuple[str, ...]) -> str:
    started = await slots.start(
        pool,
        ticket_id,
        states=states,
        woken_by="new",
        owner="test-replica",
        lease=timedelta(seconds=30),
        max_workers=3,
        human=False,
    )
    assert started is not None
    return started.id


async def _session(pool: asyncpg.Pool, ticket_id: str, assignment: str) -> WorkerSession:
    async with pool.acquire() as conn:
        convo, _ = await WorkerSession.open(conn, None, ticket_id=ticket_id, model="fake")
        await conn.execute(
            "UPDATE assignments SET session_id = $2 WHERE id = $1", assignment, convo.id
        )
    return convo


def _call(call_id: str, name: str, arguments: dict[str, object]) -> dict[str, object]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


async def test_rounds_entries_caps_and_the_whole_text(pool: asyncpg.Pool, tmp_path: Path) -> None:
    ticket_id, _ = await ticket(pool, None, title="read the log")
    one = await _round(pool, ticket_id, states=("open",))
    convo = await _session(pool, ticket_id, one)
    log = "\n".join(f"line {n}" for n in range(1, 101))
    await convo.add(pool, {"role": "user", "content": "the brief"})
    await convo.add(
        pool,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [_call("c1", "read_file", {"path": "a.log"})],
        },
    )
    await convo.add(pool, {"role": "tool", "tool_call_id": "c1", "content": log})
    await convo.add(
        pool,
        {"role": "tool", "tool_call_id": "c9", "content": json.dumps({"error": "no such tool"})},
    )
    async with pool.acquire() as conn:
        await slots.end(conn, one, "question")

    two = await _round(pool, ticket_id, states=("running",))
    await convo.add(pool, {"role": "user", "content": "a note from the control plane"})
    await convo.compact(
        pool,
        Compaction(upto_seq=3, summary="read a.log"),
        tokens_before=900,
        tokens_after=100,
        steps=["summary"],
    )
    await convo.add(
        pool,
        {
            "role": "assistant",
            "content": "Long arguments next.",
            "tool_calls": [_call("c2", "write_file", {"path": "b", "content": "z" * 400})],
        },
    )

    shown = await timeline.timeline(pool, ticket_id)
    assert [r.id for r in shown.rounds] == [one, two]
    assert [r.running for r in shown.rounds] == [False, True]
    first, second = (r.entries for r in shown.rounds)
    assert [(e.kind, e.heading) for e in first] == [
        ("brief", "control plane: brief"),
        ("call", "worker → read_file"),
        ("result", "← read_file"),
        ("result", "← tool (error)"),
    ]
    assert first[1].text == '{"path":"a.log"}'
    assert not first[1].pending
    assert first[2].text == "\n".join(f"line {n}" for n in range(1, 13))
    assert first[2].more == "88 more lines"
    assert await timeline.message_text(pool, ticket_id, first[2].message_id) == log
    assert first[3].text == "error: no such tool"
    assert [(e.kind, e.who) for e in second] == [
        ("note", "control plane"),
        ("compacted", "control plane"),
        ("said", "worker"),
        ("call", "worker"),
    ]
    assert second[1].text == "context compacted from ~900 to ~100 tokens: summary\nread a.log"
    call = second[3]
    assert call.pending  # no result yet: the round is still running
    assert len(call.text) == timeline.ARGS_CHARS
    assert call.more == f"{len(_args(400)) - timeline.ARGS_CHARS} more characters"
    whole = await timeline.message_text(pool, ticket_id, call.message_id)
    assert whole.startswith("said:\nLong arguments next.\n\ncall write_file:\n{")
    assert "z" * 400 in whole

    # Only the latest messages: the rest is counted, not shown.
    latest = await timeline.timeline(pool, ticket_id, limit=2)
    assert latest.earlier == 5
    assert [len(r.entries) for r in latest.rounds] == [0, 3]
    assert latest.as_json()["rounds"][1]["entries"][2]["recall"] == call.message_id


def _args(chars: int) -> str:
    return json.dumps({"content": "z" * chars, "path": "b"}, separators=(",", ":"))


async def test_a_running_rounds_new_message_tells_the_transcript_watchers(
    pool: asyncpg.Pool,
) -> None:
    ticket_id, _ = await ticket(pool, None, title="watch me")
    assignment = await _round(pool, ticket_id, states=("open",))
    convo = await _session(pool, ticket_id, assignment)
    await convo.add(pool, {"role": "user", "content": "the brief"})
    hub = ConsoleHub(pool, interval=0.05)
    watcher = Watcher(frozenset({"transcript"}))
    hub.join(watcher)
    try:
        await hub.poll()
        # No ticket, command or cost changes: only the conversation moves.
        await convo.add(pool, {"role": "tool", "tool_call_id": "c1", "content": "done"})
        frame = await asyncio.wait_for(watcher.frames.get(), timeout=10)
        assert frame == {"type": "changed", "topics": ["transcript"]}
        async with pool.acquire() as conn:
            await slots.end(conn, assignment, "ready")
        frame = await asyncio.wait_for(watcher.frames.get(), timeout=10)
        assert frame == {"type": "changed", "topics": ["transcript"]}
    finally:
        await hub.leave(watcher)


# -- who may read it -----------------------------------------------------------------------


async def test_nobody_but_the_admin_reads_a_transcript(pool: asyncpg.Pool) -> None:
    secret_plan = "the-migration-plan-canary-7f3a"
    ticket_id, _ = await ticket(pool, None, title="plan the migration")
    other_id, _ = await ticket(pool, None, title="something else")
    convo = await _session(pool, ticket_id, await _round(pool, ticket_id, states=("open",)))
    await convo.add(pool, {"role": "user", "content": "the brief"})
    await convo.add(pool, {"role": "assistant", "content": secret_plan})
    message_id = convo.ids[-1]
    timeline_at = f"/console/api/tickets/{ticket_id}/timeline"
    message_at = f"/console/api/tickets/{ticket_id}/messages/{message_id}"
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    async with in_process(pool) as client:
        refusals = [
            await client.get(timeline_at),
            await client.get(message_at),
            await client.get(timeline_at, headers={"Authorization": "Bearer not-the-token"}),
            await client.get(message_at, headers={"Authorization": "Bearer not-the-token"}),
            # Another site's page, even in a signed-in browser.
            await client.get(timeline_at, headers={**bearer, "Origin": "http://evil.example"}),
        ]
        # A session that signed out is over.
        signed = await client.post("/console/login", data={"token": TOKEN})
        assert signed.status_code == 303
        assert (await client.get(timeline_at)).status_code == 200
        cookies = dict(client.cookies)
        await client.post("/console/logout")
        client.cookies.update(cookies)
        refusals.append(await client.get(timeline_at))
        refusals.append(await client.get(message_at))
        for refused in refusals:
            assert refused.status_code == 401, refused.request.url
            assert secret_plan not in refused.text
            assert message_id not in refused.text
        client.cookies.clear()

        # The admin reads it; another ticket's address reads nothing of it.
        shown = await client.get(timeline_at, headers=bearer)
        assert shown.status_code == 200
        assert secret_plan in shown.text
        assert (await client.get(message_at, headers=bearer)).text == secret_plan
        foreign = await client.get(
            f"/console/api/tickets/{other_id}/messages/{message_id}", headers=bearer
        )
        assert foreign.status_code == 404
        assert secret_plan not in foreign.text
        assert (
            await client.get(f"/console/api/tickets/{other_id}/timeline", headers=bearer)
        ).json()["rounds"] == []
        bad = await client.get(f"/console/api/tickets/{ticket_id}/messages/trg_x", headers=bearer)
        assert bad.status_code == 400
        assert "not a message id" in bad.json()["error"]["message"]
        missing = await client.get("/console/api/tickets/tkt_missing/timeline", headers=bearer)
        assert missing.status_code == 404
        assert "no ticket tkt_missing" in missing.json()["error"]["message"]
