"""Worker lifecycle: slots, waking rules, device waits and their expiry, takeover, stop, retry.

A real ``WorkerService`` over real Postgres, ``LocalDevice`` devices that run commands for real,
and the fake model answering per ticket from a script (the ticket is read from the brief, the
step from how many answers the session already holds).

Background jobs that must keep running wait for a ``release`` file in their working
directory, so each test decides exactly when they end. Where a test must show that
something does *not* happen, it waits for whole passes of the service (``Passes``) instead
of sleeping.

The last two tests reproduce races between the service's housekeeping and the rounds, which
the product once got wrong (a close or a stop arriving between two steps of a pass).
"""

from __future__ import annotations

import asyncio
import inspect
import re
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import pytest

from controlplane.channels.base import ChannelAdapter, Channels, OutboundMessage
from controlplane.channels.outbound import reply_handler
from controlplane.effects.handlers import ClaimedEffect
from controlplane.errors import InvalidInput
from controlplane.gateway.delivery import CommandDelivery
from controlplane.gateway.queue import CommandQueue
from controlplane.ingest.admission import Actor
from controlplane.ingest.intake import IncomingTrigger, Ingested, Intake, ThreadRef
from controlplane.tickets import control
from controlplane.workers import worker as worker_module
from controlplane.workers.session import INTERRUPTED
from controlplane.workers.worker import RECOVERY_NOTE
from superagent_shared.ids import new_id
from tests.fakes.openai_server import (
    ChatRequest,
    FakeOpenAIServer,
    Reply,
    ToolCall,
    message_text,
)
from tests.support.helpers import assert_eventually
from tests.support.worker_harness import (  # noqa: F401 - fixtures
    LocalDevice,
    Passes,
    device_fixture,
    dsn_fixture,
    inbox_records,
    local_device,
    queue_fixture,
    replies_on,
    report_reply,
    state_is,
    ticket,
    ticket_state,
    turn_of,
    workers_running,
)

T = TypeVar("T")
Step = Callable[[ChatRequest], Reply | Awaitable[Reply]]
MakeDevice = Callable[[str], Awaitable[LocalDevice]]

ALICE = Actor("alice", "alice", groups=("console",))  # the requester of every ticket here
BOB = Actor("bob", "bob")  # a person on the thread, not allowlisted
CI_BOT = Actor("ci-bot", "ci-bot", is_bot=True)

# Runs until a file named "release" appears in its working directory (at most 20 s).
JOB = (
    "for i in $(seq 200); do if [ -f release ]; then echo job-done; exit 0; fi; "
    "sleep 0.1; done; exit 3"
)


async def _handle_pr_thread(pool: asyncpg.Pool, ticket_id: str, pr_url: str, number: int) -> str:
    """The pull request's thread, handled by the ticket (as opening the PR records it)."""
    thread_id = await pool.fetchval(
        "INSERT INTO threads (id, source, external_id, url) "
        "VALUES ($1, 'github', $2, $3) RETURNING id",
        new_id("thr"),
        f"acme/widgets#{number}",
        pr_url,
    )
    await pool.execute(
        "INSERT INTO subscriptions (thread_id, ticket_id) VALUES ($1, $2)", thread_id, ticket_id
    )
    return str(thread_id)


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture
async def make_device(pool: asyncpg.Pool, tmp_path: Path) -> AsyncIterator[MakeDevice]:
    """Paired devices, offline until the test brings them online."""
    made: list[LocalDevice] = []

    async def make(name: str) -> LocalDevice:
        root = tmp_path / name
        root.mkdir()
        device = LocalDevice(pool, CommandDelivery(pool), root, name=f"{name}-{new_id('dev')[-6:]}")
        await device.pair()
        made.append(device)
        return device

    yield make
    for device in made:
        await device.offline()


# -- the scripted model --------------------------------------------------------------------


def _ticket_of(request: ChatRequest) -> str:
    """The ticket a worker request is for: the brief (after the system prompt) names it."""
    found = re.match(r"Ticket (tkt_\w+):", message_text(request.messages[1]))
    assert found, f"not a worker request: {request.messages[1]!r}"
    return found.group(1)


def _events(request: ChatRequest) -> str:
    """Every events message the worker was shown, joined."""
    return "\n".join(
        message_text(m)
        for m in request.messages
        if m.get("role") == "user" and message_text(m).startswith("Events since")
    )


def _by_ticket(steps: dict[str, Step]) -> Callable[[ChatRequest], Awaitable[Reply]]:
    async def respond(request: ChatRequest) -> Reply:
        reply = steps[_ticket_of(request)](request)
        return await reply if inspect.isawaitable(reply) else reply

    return respond


def _requests(llm: FakeOpenAIServer, ticket_id: str) -> list[ChatRequest]:
    return [r for r in llm.chat_requests if _ticket_of(r) == ticket_id]


def _shell(command: str, call_id: str | None = None) -> Reply:
    return Reply(tool_calls=[ToolCall("shell", {"command": command}, id=call_id)])


def _one_command(command: str, summary: str) -> Step:
    """A worker that runs one command, then reports ready."""
    return lambda r: _shell(command) if turn_of(r) == 0 else report_reply("ready", summary)


def _holds_a_job(request: ChatRequest) -> Reply:
    """Start a job that keeps running, wait for it, report once it ended."""
    turn = turn_of(request)
    if turn == 0:
        return _shell(JOB)
    if "job-done" not in _events(request):
        return Reply(content="The job runs in the background; I wait for its result.")
    return report_reply("ready", "the job is done")


async def _on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the test's loop from a model callback (which runs on the fake
    server's own loop, in its thread)."""
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


# -- the database --------------------------------------------------------------------------


async def _assignments(pool: asyncpg.Pool, ticket_id: str) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT id, session_id, lease_owner, slot, woken_by, outcome, created_at, ended_at "
        "FROM assignments WHERE ticket_id = $1 ORDER BY created_at",
        ticket_id,
    )


async def _active(pool: asyncpg.Pool, ticket_ids: list[str]) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT id, ticket_id, slot FROM assignments "
        "WHERE ticket_id = ANY($1::text[]) AND ended_at IS NULL",
        ticket_ids,
    )


async def _commands(pool: asyncpg.Pool, ticket_id: str) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT c.id, c.state, c.exit_code, j.background FROM commands c "
        "JOIN jobs j ON j.command_id = c.id WHERE c.ticket_id = $1 ORDER BY c.seq",
        ticket_id,
    )


async def _post(
    pool: asyncpg.Pool,
    thread: str,
    actor: Actor,
    text: str,
    *,
    source: str = "web",
    kind: str = "message",
    url: str | None = None,
) -> Ingested:
    """An event on a thread, the way every channel adapter hands it in."""
    return await Intake(pool).ingest(
        IncomingTrigger(
            source=source,
            external_id=new_id("msg"),
            thread=ThreadRef(thread, url=url),
            actor=actor,
            kind=kind,
            text=text,
        )
    )


def _chat() -> str:
    return f"chat-{new_id('msg')}"


# -- 1. slots ------------------------------------------------------------------------------


async def test_a_round_with_a_running_job_keeps_the_only_slot(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    """max_workers=1: the round that started first keeps the slot while its background job
    runs (its turn is over), the other ticket stays open until that round ends."""
    loop = asyncio.get_running_loop()
    dirs = {name: tmp_path / name for name in ("one", "two")}
    for path in dirs.values():
        path.mkdir()
    one, _ = await ticket(pool, device, title="one", workdir=str(dirs["one"]))
    two, _ = await ticket(pool, device, title="two", workdir=str(dirs["two"]))
    workdir = {one: dirs["one"], two: dirs["two"]}
    seen_at_first_call: dict[str, tuple[str, str]] = {}

    async def step(request: ChatRequest) -> Reply:
        ticket_id = _ticket_of(request)
        if turn_of(request) == 0:
            row = await _on(
                loop,
                pool.fetchrow(
                    "SELECT a.slot, t.state FROM assignments a JOIN tickets t "
                    "ON t.id = a.ticket_id WHERE a.ticket_id = $1 AND a.ended_at IS NULL",
                    ticket_id,
                ),
            )
            assert row is not None
            seen_at_first_call[ticket_id] = (row["slot"], row["state"])
        return _holds_a_job(request)

    fake_llm.respond_with(_by_ticket({one: step, two: step}))
    async with workers_running(
        pool, queue, fake_llm, dsn, max_workers=1, foreground_seconds=1
    ) as s:
        passes = Passes(s)
        (active,) = await assert_eventually(lambda: _active(pool, [one, two]), timeout=10)
        first, second = active["ticket_id"], two if active["ticket_id"] == one else one
        assert active["slot"] == "regular"
        # Its turn is over (it answered without a tool call) and its job runs on.
        await assert_eventually(lambda: len(_requests(fake_llm, first)) >= 2, timeout=10)
        assert [c["background"] for c in await _commands(pool, first)] == [True]
        await passes.wait()
        assert await ticket_state(pool, second) == ("open", None)
        assert await _assignments(pool, second) == []
        assert [r["ticket_id"] for r in await _active(pool, [one, two])] == [first]

        (workdir[first] / "release").touch()
        await assert_eventually(lambda: state_is(pool, first, "completed"), timeout=30)
        (started,) = await assert_eventually(lambda: _assignments(pool, second), timeout=30)
        (ended,) = await _assignments(pool, first)
        assert ended["outcome"] == "ready"
        assert started["slot"] == "regular"
        assert started["created_at"] >= ended["ended_at"]
        await assert_eventually(lambda: len(_requests(fake_llm, second)) >= 2, timeout=30)
        (workdir[second] / "release").touch()
        await assert_eventually(lambda: state_is(pool, second, "completed"), timeout=30)
    # The slot was taken before the model was first asked anything, by a running ticket.
    assert seen_at_first_call == {one: ("regular", "running"), two: ("regular", "running")}
    fake_llm.respond_with(None)


# -- 2. the extra human slot ---------------------------------------------------------------


async def test_a_human_message_uses_the_extra_slot_when_the_regular_one_is_busy(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    """A ticket waiting after a question, with the only regular slot held by another
    round: a bot message on its thread does not wake it, a person's message starts a round
    in the human slot."""
    asked_thread = _chat()
    asked, _ = await ticket(pool, device, title="ask first", thread=asked_thread)
    steps: dict[str, Step] = {
        asked: lambda r: (
            report_reply("question", "need a branch", question="Which branch?")
            if turn_of(r) == 0
            else report_reply("ready", "worked on main")
        )
    }
    fake_llm.respond_with(_by_ticket(steps))
    async with workers_running(
        pool, queue, fake_llm, dsn, max_workers=1, foreground_seconds=1
    ) as s:
        passes = Passes(s)
        await assert_eventually(
            lambda: state_is(pool, asked, "waiting_human", "question"), timeout=10
        )
        busy, _ = await ticket(pool, device, title="busy", workdir=str(tmp_path))
        steps[busy] = _holds_a_job
        await assert_eventually(lambda: len(_requests(fake_llm, busy)) >= 2, timeout=10)
        (regular,) = await _active(pool, [busy, asked])
        assert (regular["ticket_id"], regular["slot"]) == (busy, "regular")

        bot = await _post(pool, asked_thread, CI_BOT, "nightly build: green")
        assert bot.tickets == (asked,)
        await passes.wait()
        assert await ticket_state(pool, asked) == ("waiting_human", "question")
        assert len(await _assignments(pool, asked)) == 1

        human = await _post(pool, asked_thread, BOB, "Use main.")
        assert human.tickets == (asked,)
        await assert_eventually(lambda: state_is(pool, asked, "completed"), timeout=10)
        _first, woken = await _assignments(pool, asked)
        assert (woken["slot"], woken["woken_by"], woken["outcome"]) == ("human", "human", "ready")
        # The regular slot was busy all along: its round is still on.
        (still,) = await _active(pool, [busy, asked])
        assert (still["id"], still["slot"]) == (regular["id"], "regular")
        assert "Use main." in _events(_requests(fake_llm, asked)[-1])

        (tmp_path / "release").touch()
        await assert_eventually(lambda: state_is(pool, busy, "completed"), timeout=10)
    fake_llm.respond_with(None)


# -- 3. waking rules -----------------------------------------------------------------------


@pytest.mark.parametrize("status", ["blocked", "failed"])
async def test_after_blocked_or_failed_only_a_person_wakes_the_worker(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    status: str,
) -> None:
    """A CI bot's event is recorded for the worker but does not wake it; a person's does,
    and the worker then reads both."""
    thread = _chat()
    ticket_id, _ = await ticket(pool, device, thread=thread)
    fake_llm.respond_with(
        _by_ticket(
            {
                ticket_id: lambda r: (
                    report_reply(status, "the registry is unreachable")
                    if turn_of(r) == 0
                    else report_reply("ready", "used the mirror")
                )
            }
        )
    )
    async with workers_running(pool, queue, fake_llm, dsn) as service:
        passes = Passes(service)
        await assert_eventually(
            lambda: state_is(pool, ticket_id, "waiting_human", status), timeout=10
        )
        ci = await _post(pool, thread, CI_BOT, "CI: lint failed", kind="check_run.completed")
        assert ci.tickets == (ticket_id,)
        inbox = await pool.fetchrow(
            "SELECT read_at FROM ticket_inbox WHERE ticket_id = $1 AND trigger_id = $2",
            ticket_id,
            ci.trigger_id,
        )
        assert inbox is not None
        assert inbox["read_at"] is None
        await passes.wait()
        assert await ticket_state(pool, ticket_id) == ("waiting_human", status)
        assert len(await _assignments(pool, ticket_id)) == 1
        assert len(_requests(fake_llm, ticket_id)) == 1

        person = await _post(pool, thread, BOB, "Try the mirror.")
        await assert_eventually(lambda: state_is(pool, ticket_id, "completed"), timeout=10)
    _, woken = await _assignments(pool, ticket_id)
    assert woken["woken_by"] == "human"
    shown = [
        (r["trigger"], r["kind"], r["from"], r["authority"], r["text"])
        for r in inbox_records(_requests(fake_llm, ticket_id)[1])
        if r["type"] == "event"
    ]
    assert shown == [
        (ci.trigger_id, "check_run.completed", "ci-bot", "CI", "CI: lint failed"),
        (person.trigger_id, "message", "bob", "not allowlisted", "Try the mirror."),
    ]
    fake_llm.respond_with(None)


async def test_in_ready_a_bot_event_wakes_the_worker(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
) -> None:
    """A ticket whose pull request is open waits in ready, and CI results wake it."""
    thread = _chat()
    ticket_id, _ = await ticket(pool, device, thread=thread)
    pr_url = "https://github.com/acme/widgets/pull/12"
    fake_llm.respond_with(
        _by_ticket(
            {
                ticket_id: lambda r: (
                    report_reply("ready", "opened the PR", pr_url=pr_url)
                    if "CI failed" not in _events(r)
                    else report_reply("ready", "fixed CI")
                )
            }
        )
    )
    async with workers_running(pool, queue, fake_llm, dsn):
        await assert_eventually(lambda: state_is(pool, ticket_id, "ready"), timeout=10)
        assert await pool.fetchval("SELECT pr_url FROM tickets WHERE id = $1", ticket_id) == pr_url
        ci = await _post(pool, thread, CI_BOT, "CI failed: test_x", kind="check_suite.completed")
        assert ci.tickets == (ticket_id,)
        await assert_eventually(lambda: len(_requests(fake_llm, ticket_id)) >= 2, timeout=10)
        await assert_eventually(lambda: _ended(pool, ticket_id, 2), timeout=10)
        assert await ticket_state(pool, ticket_id) == ("ready", None)
    _first, woken = await _assignments(pool, ticket_id)
    assert (woken["woken_by"], woken["slot"], woken["outcome"]) == ("event", "regular", "ready")
    assert "CI failed: test_x" in _events(_requests(fake_llm, ticket_id)[1])
    fake_llm.respond_with(None)


async def _ended(pool: asyncpg.Pool, ticket_id: str, rounds: int) -> bool:
    rows = await _assignments(pool, ticket_id)
    return len(rows) == rounds and all(row["ended_at"] is not None for row in rows)


# -- 4. the pull request closes ------------------------------------------------------------


async def test_a_closed_pull_request_completes_a_ready_ticket_without_the_model(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
) -> None:
    ticket_id, _ = await ticket(pool, device)
    pr_url = "https://github.com/acme/widgets/pull/7"
    fake_llm.script(report_reply("ready", "opened the PR", pr_url=pr_url))
    async with workers_running(pool, queue, fake_llm, dsn):
        await assert_eventually(lambda: state_is(pool, ticket_id, "ready"), timeout=10)
    pr_thread = await _handle_pr_thread(pool, ticket_id, pr_url, 7)
    calls = len(fake_llm.chat_requests)
    closed = await _post(
        pool,
        "acme/widgets#7",
        Actor("carol", "carol"),
        "carol merged the pull request",
        source="github",
        kind="pull_request.closed",
        url=pr_url,
    )
    assert (closed.thread_id, closed.tickets) == (pr_thread, (ticket_id,))
    async with workers_running(pool, queue, fake_llm, dsn):
        await assert_eventually(
            lambda: state_is(pool, ticket_id, "completed", "pull request closed"), timeout=10
        )
    assert len(fake_llm.chat_requests) == calls
    assert len(await _assignments(pool, ticket_id)) == 1
    assert await pool.fetchval(
        "SELECT read_at IS NOT NULL FROM ticket_inbox WHERE ticket_id = $1 AND trigger_id = $2",
        ticket_id,
        closed.trigger_id,
    )


# -- 5. the device is away -----------------------------------------------------------------


async def test_a_ticket_waits_for_its_offline_device_and_resumes_when_it_is_back(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    make_device: MakeDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
) -> None:
    away = await make_device("away")
    ticket_id, thread_id = await ticket(pool, away, workdir=str(away.root))
    fake_llm.respond_with(
        _by_ticket({ticket_id: _one_command("echo back-$((1+1))", "ran it on the device")})
    )
    async with workers_running(pool, queue, fake_llm, dsn, device_wait_seconds=3600) as service:
        passes = Passes(service)
        await assert_eventually(
            lambda: state_is(pool, ticket_id, "waiting_device", "device"), timeout=10
        )
        until: datetime | None = await pool.fetchval(
            "SELECT wait_until FROM tickets WHERE id = $1", ticket_id
        )
        assert until is not None
        (waited,) = await _assignments(pool, ticket_id)
        assert waited["outcome"] == "waiting_device"
        assert waited["ended_at"] is not None
        (told,) = await replies_on(pool, thread_id)
        assert away.name in told
        assert f"{until:%Y-%m-%d %H:%M} UTC" in told
        assert fake_llm.chat_requests == []
        # Nothing happens while the device is away: no round, no second message.
        await passes.wait()
        assert await ticket_state(pool, ticket_id) == ("waiting_device", "device")
        assert len(await _assignments(pool, ticket_id)) == 1

        await away.online()
        await assert_eventually(lambda: state_is(pool, ticket_id, "completed"), timeout=10)
    _, resumed = await _assignments(pool, ticket_id)
    assert (resumed["woken_by"], resumed["outcome"]) == ("device", "ready")
    assert len(await replies_on(pool, thread_id)) == 1
    assert '"output": "back-2\\n"' in _requests(fake_llm, ticket_id)[-1].text()
    fake_llm.respond_with(None)


class _Chat(ChannelAdapter):
    """The web chat as the outbox sees it: records what it is asked to send."""

    source = "web"

    def __init__(self) -> None:
        self.sent: list[OutboundMessage] = []

    async def send(self, message: OutboundMessage) -> str:
        self.sent.append(message)
        return message.reply_id


async def _deliver(pool: asyncpg.Pool, chat: _Chat, thread_id: str) -> None:
    """Run the outbox's reply handler on every reply queued for the thread, delay or not."""
    send = reply_handler(pool, Channels([chat]))
    for row in await pool.fetch(
        "SELECT id, kind, key, payload, generation FROM effects "
        "WHERE kind = 'reply' AND payload->>'thread_id' = $1",
        thread_id,
    ):
        await send(
            ClaimedEffect(row["id"], row["kind"], row["key"], row["payload"], row["generation"], 1)
        )


def _waits_for_device(pool: asyncpg.Pool, ticket_id: str) -> Callable[[], Awaitable[bool]]:
    return lambda: state_is(pool, ticket_id, "waiting_device", "device")


async def test_a_device_back_within_the_grace_is_nobodys_news(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    make_device: MakeDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
) -> None:
    """A link cut or a laptop lid closed for a moment: the ticket waits for its device, but
    its thread hears of it only if the device is still away after the grace. On the old
    code the notice went out at once, every time a link dropped."""
    blip, gone = await make_device("blip"), await make_device("gone")
    blip_ticket, blip_thread = await ticket(pool, blip, workdir=str(blip.root))
    gone_ticket, gone_thread = await ticket(pool, gone, workdir=str(gone.root))
    fake_llm.respond_with(
        _by_ticket(
            {
                blip_ticket: _one_command("echo back", "ran it"),
                gone_ticket: _one_command("echo never", "ran it"),
            }
        )
    )
    chat = _Chat()
    async with workers_running(pool, queue, fake_llm, dsn, device_notice_seconds=30):
        for waiting in (blip_ticket, gone_ticket):
            await assert_eventually(
                _waits_for_device(pool, waiting), timeout=10, message=f"{waiting} waits"
            )
        delayed = await pool.fetchval(
            "SELECT bool_and(next_attempt_at > now() + interval '20 seconds') FROM effects "
            "WHERE kind = 'reply' AND payload->>'thread_id' = ANY($1::text[])",
            [blip_thread, gone_thread],
        )
        assert delayed is True  # nobody is told yet
        await blip.online()
        await assert_eventually(lambda: state_is(pool, blip_ticket, "completed"), timeout=10)
    # The grace is over: the outbox runs both notices. Only the device still away is news.
    await _deliver(pool, chat, blip_thread)
    assert chat.sent == []
    await _deliver(pool, chat, gone_thread)
    assert len(chat.sent) == 1
    assert "is waiting for the device gone-" in chat.sent[0].text


async def test_a_command_for_a_device_gone_mid_task_stays_queued_and_reports_later(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    """The device drops while the model decides: its command waits in the queue, the
    ticket waits for the device, and once it is back the command runs and its result
    reaches the worker as an event."""
    loop = asyncio.get_running_loop()
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path))

    async def step(request: ChatRequest) -> Reply:
        if turn_of(request) == 0:
            await _on(loop, device.offline())
            return _shell("echo resumed-$((40+2))")
        if "resumed-42" in _events(request):
            return report_reply("ready", "the queued command ran")
        return Reply(content="Waiting for the queued command.")

    fake_llm.respond_with(_by_ticket({ticket_id: step}))
    async with workers_running(pool, queue, fake_llm, dsn, device_wait_seconds=3600) as service:
        passes = Passes(service)
        await assert_eventually(
            lambda: state_is(pool, ticket_id, "waiting_device", "device"), timeout=10
        )
        (command,) = await _commands(pool, ticket_id)
        assert (command["state"], command["background"]) == ("queued", True)
        first_result = _requests(fake_llm, ticket_id)
        assert len(first_result) == 1
        await passes.wait()
        assert (await _commands(pool, ticket_id))[0]["state"] == "queued"

        await device.online()
        await assert_eventually(lambda: state_is(pool, ticket_id, "completed"), timeout=10)
    (done,) = await _commands(pool, ticket_id)
    assert (done["id"], done["state"], done["exit_code"]) == (command["id"], "finished", 0)
    assert [r["argv"][-1] for r in device.ran] == ["echo resumed-$((40+2))"]
    (job,) = [
        r for r in inbox_records(_requests(fake_llm, ticket_id)[-1]) if r["type"] == "job_ended"
    ]
    assert (job["job"], job["output"]) == (command["id"], "resumed-42\n")
    fake_llm.respond_with(None)


async def test_a_device_that_sleeps_during_a_job_frees_the_slot_and_resumes(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A background job runs; the laptop goes away for longer than a reconnect: the round
    gives its slot up and the ticket waits; back, the job's result wakes the worker."""
    monkeypatch.setattr(worker_module, "AWAY_GRACE", timedelta(seconds=1))
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path))
    fake_llm.respond_with(_by_ticket({ticket_id: _holds_a_job}))
    async with workers_running(pool, queue, fake_llm, dsn, foreground_seconds=1) as service:
        await assert_eventually(lambda: len(_requests(fake_llm, ticket_id)) == 2, timeout=10)
        await device.offline()
        await assert_eventually(
            lambda: state_is(pool, ticket_id, "waiting_device", "device"), timeout=10
        )
        rounds = await _assignments(pool, ticket_id)
        assert [r["outcome"] for r in rounds] == ["waiting_device"]
        await Passes(service).wait()
        (tmp_path / "release").touch()
        await device.online()
        await assert_eventually(lambda: state_is(pool, ticket_id, "completed"), timeout=15)
    assert "job-done" in _events(_requests(fake_llm, ticket_id)[-1])
    fake_llm.respond_with(None)


# -- 6. the wait expires -------------------------------------------------------------------


async def _expire(pool: asyncpg.Pool, ticket_id: str, thread_id: str, away: LocalDevice) -> None:
    """Wait for the device wait to expire, and check people were asked once."""
    await assert_eventually(
        lambda: state_is(pool, ticket_id, "waiting_human", "device_expired"), timeout=10
    )
    asked = [text for text in await replies_on(pool, thread_id) if "has not come back" in text]
    assert len(asked) == 1
    assert away.name in asked[0]
    assert "reroute <device>" in asked[0]
    assert "`drop`" in asked[0]


async def test_an_expired_device_wait_is_rerouted_by_the_requester(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    make_device: MakeDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
) -> None:
    away = await make_device("away")
    other = await make_device("other")
    thread = _chat()
    ticket_id, thread_id = await ticket(pool, away, thread=thread)
    fake_llm.respond_with(
        _by_ticket({ticket_id: _one_command("echo here-$((2+3))", "done on the other device")})
    )
    async with workers_running(pool, queue, fake_llm, dsn, device_wait_seconds=1) as service:
        passes = Passes(service)
        await _expire(pool, ticket_id, thread_id, away)
        await passes.wait()
        await _expire(pool, ticket_id, thread_id, away)  # asked once, not every pass
        await other.online()
        await _post(pool, thread, ALICE, f"reroute {other.name}")
        await assert_eventually(lambda: state_is(pool, ticket_id, "completed"), timeout=10)
    assert await pool.fetchval("SELECT device_id FROM tickets WHERE id = $1", ticket_id) == (
        other.id
    )
    assert [r["argv"][-1] for r in other.ran] == ["echo here-$((2+3))"]
    assert away.ran == []
    assert any(
        f"moves to the device {other.name}" in text for text in await replies_on(pool, thread_id)
    )
    requests = _requests(fake_llm, ticket_id)
    assert f"alice moved this ticket to the device {other.name}" in _events(requests[0])
    assert '"output": "here-5\\n"' in requests[-1].text()
    rounds = await _assignments(pool, ticket_id)
    assert [r["outcome"] for r in rounds] == ["waiting_device", "ready"]
    fake_llm.respond_with(None)


async def test_an_expired_device_wait_is_dropped_by_the_requester(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    make_device: MakeDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
) -> None:
    away = await make_device("away")
    thread = _chat()
    ticket_id, thread_id = await ticket(pool, away, thread=thread)
    async with workers_running(pool, queue, fake_llm, dsn, device_wait_seconds=1):
        await _expire(pool, ticket_id, thread_id, away)
        await _post(pool, thread, ALICE, "drop")
        await assert_eventually(lambda: state_is(pool, ticket_id, "stopped"), timeout=10)
    assert await pool.fetchval(
        "SELECT revoked_at IS NOT NULL FROM mandates WHERE ticket_id = $1", ticket_id
    )
    assert any(f"Dropped {ticket_id}" in text for text in await replies_on(pool, thread_id))
    assert fake_llm.chat_requests == []


# -- 7. takeover ---------------------------------------------------------------------------


async def test_another_replica_takes_over_an_orphaned_round_in_the_same_session(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    """Replica A dies while a tool call runs (the call is stored, its result never is);
    replica B resumes the same round and session, answers the call "interrupted", adds the
    recovery note, and finishes."""
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path))
    fake_llm.respond_with(
        _by_ticket(
            {
                ticket_id: lambda r: (
                    _shell(JOB, call_id="call_orphaned")
                    if turn_of(r) == 0
                    else report_reply("ready", "checked the state, all done")
                )
            }
        )
    )
    try:
        # The job outlasts A's foreground wait, so A is inside the call when it goes.
        async with workers_running(
            pool, queue, fake_llm, dsn, owner="replica-a", foreground_seconds=30
        ):
            await assert_eventually(
                lambda: _commands(pool, ticket_id), timeout=10, message="the call runs"
            )
            await assert_eventually(
                lambda: _command_state_is(pool, ticket_id, "running"), timeout=10
            )
        # Only now that A is gone does its lease look expired (and owned by a dead
        # replica): expired while A still ran, A's next pass would take it back itself.
        orphan = await pool.fetchrow(
            "UPDATE assignments SET lease_expires_at = now() - interval '1 s', "
            "lease_owner = 'dead' WHERE ticket_id = $1 AND ended_at IS NULL "
            "RETURNING id, session_id",
            ticket_id,
        )
        assert orphan is not None
        assert orphan["session_id"] is not None
        stored = await pool.fetch(
            "SELECT role FROM session_messages WHERE session_id = $1 ORDER BY seq",
            orphan["session_id"],
        )
        assert [m["role"] for m in stored] == ["user", "assistant"]  # the call has no result
        assert await ticket_state(pool, ticket_id) == ("running", None)

        async with workers_running(pool, queue, fake_llm, dsn, owner="replica-b"):
            await assert_eventually(lambda: state_is(pool, ticket_id, "completed"), timeout=10)
    finally:
        (tmp_path / "release").touch()
    (taken,) = await _assignments(pool, ticket_id)
    assert (taken["id"], taken["session_id"]) == (orphan["id"], orphan["session_id"])
    assert (taken["lease_owner"], taken["outcome"]) == ("replica-b", "ready")
    sessions = await pool.fetch("SELECT id FROM sessions WHERE ticket_id = $1", ticket_id)
    assert [s["id"] for s in sessions] == [orphan["session_id"]]

    on_a, on_b = _requests(fake_llm, ticket_id)
    assert on_b.messages[: len(on_a.messages)] == on_a.messages  # the same conversation
    assert [m.get("role") for m in on_b.messages[len(on_a.messages) :]] == [
        "assistant",
        "tool",
        "user",
    ]
    call, answer, note = on_b.messages[len(on_a.messages) :]
    assert call["tool_calls"][0]["id"] == "call_orphaned"
    assert (answer["tool_call_id"], answer["content"]) == ("call_orphaned", INTERRUPTED)
    assert note["content"] == RECOVERY_NOTE
    await assert_eventually(lambda: _command_state_is(pool, ticket_id, "finished"), timeout=10)
    fake_llm.respond_with(None)


async def _command_state_is(pool: asyncpg.Pool, ticket_id: str, state: str) -> bool:
    return [c["state"] for c in await _commands(pool, ticket_id)] == [state]


# -- 8. /stop ------------------------------------------------------------------------------


async def test_stop_in_an_explicit_request_stops_the_ticket_and_its_job(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    """While the worker thinks (its model call held open) and its background job runs,
    alice says "/stop" on the thread: the ticket stops and the job is cancelled on the
    device. The worker never reads the /stop."""
    thread = _chat()
    ticket_id, thread_id = await ticket(pool, device, workdir=str(tmp_path), thread=thread)
    thinking = threading.Event()  # set by the test: the held model call may answer

    async def step(request: ChatRequest) -> Reply:
        if turn_of(request) == 0:
            return _shell(JOB)
        await asyncio.to_thread(thinking.wait, 20)
        return Reply(content="Still waiting for the job.")

    fake_llm.respond_with(_by_ticket({ticket_id: step}))
    try:
        async with workers_running(pool, queue, fake_llm, dsn, foreground_seconds=1):
            await assert_eventually(lambda: len(_requests(fake_llm, ticket_id)) == 2, timeout=10)
            (job,) = await _commands(pool, ticket_id)
            assert (job["state"], job["background"]) == ("running", True)

            stop = await _post(pool, thread, ALICE, "@superagent /stop")
            assert (stop.verdict, stop.tickets) == ("explicit", (ticket_id,))
            await assert_eventually(
                lambda: state_is(pool, ticket_id, "stopped", "stopped by alice"), timeout=10
            )
            await assert_eventually(
                lambda: _command_state_is(pool, ticket_id, "cancelled"), timeout=10
            )
            assert [r["target_command_id"] for r in device.ran if r["kind"] == "cancel"] == [
                job["id"]
            ]
    finally:
        thinking.set()
        (tmp_path / "release").touch()
    assert await pool.fetchval(
        "SELECT revoked_at IS NOT NULL FROM mandates WHERE ticket_id = $1", ticket_id
    )
    (stopped,) = await _assignments(pool, ticket_id)
    assert stopped["outcome"] == "stopped"
    assert f"Stopped {ticket_id}, as alice asked." in await replies_on(pool, thread_id)
    assert all("/stop" not in _events(r) for r in _requests(fake_llm, ticket_id))
    fake_llm.respond_with(None)


# -- 9. retry ------------------------------------------------------------------------------


async def test_retry_wakes_a_worker_waiting_for_people(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
) -> None:
    ticket_id, _ = await ticket(pool, device)
    fake_llm.respond_with(
        _by_ticket(
            {
                ticket_id: lambda r: (
                    report_reply("blocked", "the port is taken")
                    if turn_of(r) == 0
                    else report_reply("ready", "used another port")
                )
            }
        )
    )
    async with workers_running(pool, queue, fake_llm, dsn):
        await assert_eventually(
            lambda: state_is(pool, ticket_id, "waiting_human", "blocked"), timeout=10
        )
        await control.retry(pool, ticket_id, by="alice", note="Use port 8080.")
        await assert_eventually(lambda: state_is(pool, ticket_id, "completed"), timeout=10)
    _, woken = await _assignments(pool, ticket_id)
    assert (woken["woken_by"], woken["outcome"]) == ("event", "ready")
    assert {
        "type": "notice",
        "kind": "retry",
        "authority": "operator",
        "text": "alice asks you to try again. Use port 8080.",
    } in inbox_records(_requests(fake_llm, ticket_id)[1])
    assert not await pool.fetchval(
        "SELECT count(*) FROM worker_events WHERE ticket_id = $1 AND read_at IS NULL", ticket_id
    )
    with pytest.raises(InvalidInput, match="completed"):
        await control.retry(pool, ticket_id, by="alice")
    fake_llm.respond_with(None)


# -- races between the service's housekeeping and the rounds -------------------------------


async def test_a_pull_request_closed_just_before_a_claim_still_completes_the_ticket(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
) -> None:
    """The close arrives after a pass's housekeeping and before its claim (nothing orders
    a webhook against a pass): the ticket must still complete, without a round."""
    ticket_id, _ = await ticket(pool, device)
    pr_url = "https://github.com/acme/widgets/pull/8"
    fake_llm.respond_with(
        _by_ticket({ticket_id: lambda r: report_reply("ready", "PR", pr_url=pr_url)})
    )
    async with workers_running(pool, queue, fake_llm, dsn):
        await assert_eventually(lambda: state_is(pool, ticket_id, "ready"), timeout=10)
    await _handle_pr_thread(pool, ticket_id, pr_url, 8)
    calls = len(fake_llm.chat_requests)
    posted: list[Ingested] = []
    async with workers_running(pool, queue, fake_llm, dsn) as service:
        housekeeping = service._housekeeping

        async def then_the_close() -> None:
            await housekeeping()
            if not posted:
                posted.append(
                    await _post(
                        pool,
                        "acme/widgets#8",
                        Actor("carol", "carol"),
                        "carol closed the pull request",
                        source="github",
                        kind="pull_request.closed",
                        url=pr_url,
                    )
                )

        service._housekeeping = then_the_close
        await assert_eventually(
            lambda: (
                len(fake_llm.chat_requests) > calls
                or state_is(pool, ticket_id, "completed", "pull request closed")
            ),
            timeout=10,
        )
        await Passes(service).wait()
    assert len(fake_llm.chat_requests) == calls, "a round was started for the closed PR"
    assert await ticket_state(pool, ticket_id) == ("completed", "pull request closed")
    fake_llm.respond_with(None)


async def test_a_stop_is_never_read_by_the_worker_and_still_stops_the_ticket(
    pool: asyncpg.Pool,
    queue: CommandQueue,
    device: LocalDevice,
    fake_llm: FakeOpenAIServer,
    dsn: str,
    tmp_path: Path,
) -> None:
    """The worker's own loop reads the ticket's inbox too. When it reads before the
    service's housekeeping does, it must not take the "/stop" (the service carries it out),
    and the ticket must still stop."""
    thread = _chat()
    ticket_id, _ = await ticket(pool, device, workdir=str(tmp_path), thread=thread)
    shown: list[str] = []  # the events of each later request

    def step(request: ChatRequest) -> Reply:
        if turn_of(request) == 0:
            return _shell(JOB)
        shown.append(_events(request))
        return Reply(content="Waiting for the job.")

    fake_llm.respond_with(_by_ticket({ticket_id: step}))
    try:
        async with workers_running(pool, queue, fake_llm, dsn, foreground_seconds=1) as service:
            housekeeping = service._housekeeping

            async def after_the_worker() -> None:
                if any("also check" in events for events in shown):
                    await housekeeping()

            await assert_eventually(lambda: len(_requests(fake_llm, ticket_id)) == 2, timeout=10)
            service._housekeeping = after_the_worker
            await _post(pool, thread, ALICE, "@superagent /stop")
            await _post(pool, thread, ALICE, "also check the other module")
            await assert_eventually(
                lambda: any("also check" in events for events in shown),
                timeout=30,  # a model call and a pass; 10 s was short on a loaded machine
                message="the worker read the other message",
            )
            await Passes(service).wait()
            assert await ticket_state(pool, ticket_id) == ("stopped", "stopped by alice")
    finally:
        (tmp_path / "release").touch()
    assert not any("/stop" in events for events in shown)
    fake_llm.respond_with(None)
