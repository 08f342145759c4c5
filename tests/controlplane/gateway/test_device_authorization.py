"""Per-device authorization, played by the attacker: Bob, an allowlisted teammate, tries to
run work on Alice's laptop through every way in.

Alice owns ``alice-laptop`` (paired with ``--owner alice``, a person linked to her Slack
account). Bob is allowlisted too, and owns ``bob-desktop``. Bob gets nothing onto Alice's
laptop: not with rules-only ``/run``, not through the router's ``create_ticket``, not by
rerouting a ticket (the worker API, the CLI, the console, the device-wait answer), unless
Alice shares the device with him or approves the request in chat. A team device paired
with ``--shared GROUP`` is usable by that group. An approval sent by Bob, or by someone who
merely calls himself "alice", is ignored and recorded; a denial or a timeout stops the
ticket; and below every entry point, a ticket's command is not queued on a device its
recorded authorization does not cover.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.domain import EffectKind
from controlplane.effects.handlers import ClaimedEffect, Postpone
from controlplane.errors import SuperagentError
from controlplane.gateway import specs
from controlplane.gateway.delivery import CommandDelivery
from controlplane.gateway.queue import CommandQueue
from controlplane.ingest.admission import Actor, Admission, SourceAdmission
from controlplane.ingest.intake import IncomingTrigger, Ingested, Intake, ThreadRef
from controlplane.router.rules_only import RulesOnlyRouter, run_handler
from controlplane.router.tools.core import Turn
from controlplane.router.tools.toolbox import Toolbox
from controlplane.settings import Settings, WorkerSettings
from controlplane.tickets import control
from superagent_shared.ids import new_id
from tests.fakes.openai_server import FAKE_MODEL, ChatRequest, FakeOpenAIServer, Reply, ToolCall
from tests.support.helpers import assert_eventually, run_cli, save_policy
from tests.support.worker_harness import (  # noqa: F401 - fixtures
    LocalDevice,
    dsn_fixture,
    queue_fixture,
    workers_running,
)

ALICE = Actor("T0001/U0ALICE", "alice", groups=("eng",))
BOB = Actor("T0001/U0BOB", "bob", groups=("eng",))
# Allowlisted, and calls himself "alice" on Slack: a display name, not Alice's account.
IMPOSTOR = Actor("T0001/U0MALLORY", "alice", groups=("eng",))
OLGA = Actor("T0001/U0OLGA", "olga", groups=("ops",))  # allowlisted through another group
POLICY = Admission(default=SourceAdmission(groups=["eng", "ops"]))
TURN = Turn(session_id=None, llm_call_id=None, batch=())
APPROVAL_ID = re.compile(r"\bapprove (apr_[0-9a-z]{12})\b")


class World:
    def __init__(
        self, pool: asyncpg.Pool, queue: CommandQueue, laptop: LocalDevice, desktop: LocalDevice
    ) -> None:
        self.pool = pool
        self.laptop = laptop
        self.desktop = desktop
        self.intake = Intake(pool)
        self.tools = Toolbox(pool, self.intake.policy)
        self.rules_only = RulesOnlyRouter(pool, queue)
        self._n = 0

    async def say(self, actor: Actor, text: str, thread: str = "C1/1000.0001") -> Ingested:
        self._n += 1
        return await self.intake.ingest(
            IncomingTrigger(
                source="slack",
                external_id=f"{thread}/{new_id('msg')}",
                thread=ThreadRef(thread),
                actor=actor,
                kind="message",
                text=text,
            )
        )

    async def slash(self, actor: Actor, text: str, thread: str = "C1/1000.0001") -> Ingested:
        """``actor`` sends a slash command (``/run``), and the rules-only router takes its
        turn on it, as it does when no model is configured."""
        said = await self.say(actor, text, thread)
        await self.rules_only.turn()
        return said

    async def ask_ticket(
        self, actor: Actor, device: str | None, *, thread: str = "C1/1000.0001", title: str = ""
    ) -> tuple[dict[str, Any], Ingested]:
        """``actor`` asks for work; the router's model creates a ticket on ``device``."""
        request = await self.say(actor, "@superagent fix the flaky test", thread)
        assert request.verdict == "explicit", request.reason
        result = await self.tools.call(
            "create_ticket",
            {
                "title": title or f"Fix the flaky test ({new_id('msg')[-4:]})",
                "scope": "tests/test_x.py only",
                "threads": [],
                "device": device,
                "mandate_from": request.trigger_id,
            },
            TURN,
        )
        assert result.ok, result.content
        return result.content, request


@pytest.fixture
async def world(
    pool: asyncpg.Pool,
    db: async_sessionmaker[AsyncSession],
    queue: CommandQueue,
    tmp_path: Path,
) -> World:
    await save_policy(db, POLICY)
    await _link(pool, "alice", "slack", ALICE.id)  # superagent users link alice slack:…
    await _link(pool, "bob", "slack", BOB.id)
    (tmp_path / "alice").mkdir()
    (tmp_path / "bob").mkdir()
    delivery = CommandDelivery(pool)
    laptop = LocalDevice(pool, delivery, tmp_path / "alice", name="alice-laptop")
    await laptop.pair(owner="alice")  # superagent devices pair --name alice-laptop --owner alice
    desktop = LocalDevice(pool, delivery, tmp_path / "bob", name="bob-desktop")
    await desktop.pair(owner="bob")
    return World(pool, queue, laptop, desktop)


Workers = Callable[[], contextlib.AbstractAsyncContextManager[Any]]


@pytest.fixture
def workers(
    pool: asyncpg.Pool, queue: CommandQueue, fake_llm: FakeOpenAIServer, dsn: str
) -> Workers:
    """``async with workers() as service``: a ``WorkerService`` over this test's database,
    queue and model, for the tests that follow Bob's request as far as a worker."""
    return lambda: workers_running(pool, queue, fake_llm, dsn)


async def _link(pool: asyncpg.Pool, person: str, source: str, actor_id: str) -> None:
    """A person and one account of theirs, by its immutable id (as `users link` stores it)."""
    person_id = await pool.fetchval(
        "INSERT INTO people (id, name) VALUES ($1, $2) RETURNING id", new_id("prs"), person
    )
    await pool.execute(
        "INSERT INTO accounts (source, handle, person_id) VALUES ($1, $2, $3)",
        source,
        actor_id,
        person_id,
    )


def _json(value: object) -> dict[str, Any]:
    parsed = json.loads(value) if isinstance(value, str) else value
    assert isinstance(parsed, dict)
    return parsed


async def _replies(pool: asyncpg.Pool, thread_id: str | None = None) -> list[str]:
    rows = await pool.fetch(
        "SELECT payload FROM effects WHERE kind = $1 ORDER BY created_at, id", EffectKind.REPLY
    )
    payloads = [_json(row["payload"]) for row in rows]
    return [str(p["text"]) for p in payloads if thread_id is None or p["thread_id"] == thread_id]


async def _commands_on(pool: asyncpg.Pool, device: LocalDevice) -> int:
    count = await pool.fetchval(
        "SELECT count(*) FROM commands WHERE device_id = $1 AND kind <> 'cancel'", device.id
    )
    assert isinstance(count, int)
    return count


async def _run_effects(pool: asyncpg.Pool, queue: CommandQueue) -> None:
    """Carry out every queued /run as the outbox would (each once)."""
    handler = run_handler(pool, queue)
    for row in await pool.fetch("SELECT * FROM effects WHERE kind = $1", EffectKind.RUN_COMMAND):
        claimed = ClaimedEffect(
            row["id"], EffectKind.RUN_COMMAND, row["key"], _json(row["payload"]), 1, 1
        )
        with contextlib.suppress(Postpone):  # submitted; its result is not final yet
            await handler(claimed)


async def _cannot_queue(queue: CommandQueue, device: LocalDevice, ticket_id: str) -> None:
    """Below every entry point: the ticket's command is refused on the device."""
    with pytest.raises(SuperagentError, match="not authorized"):
        await queue.submit(device.id, specs.Exec(["touch", "pwned"]), ticket_id=ticket_id)


async def _ticket(pool: asyncpg.Pool, ticket_id: str) -> asyncpg.Record:
    row = await pool.fetchrow("SELECT * FROM tickets WHERE id = $1", ticket_id)
    assert row is not None
    return row


async def _waits_for_alice(world: World, queue: CommandQueue, ticket_id: str) -> asyncpg.Record:
    """The ticket waits for Alice to approve it, and meanwhile none of its commands can be
    queued on her laptop (what every way in must end with). Returns the ticket's row."""
    ticket = await _ticket(world.pool, ticket_id)
    assert (ticket["state"], ticket["hold"]) == ("waiting_human", "device_approval")
    await _cannot_queue(queue, world.laptop, ticket_id)
    return ticket


@contextlib.asynccontextmanager
async def _laptop_online(
    world: World, llm: FakeOpenAIServer, model: Callable[[ChatRequest], Reply]
) -> AsyncIterator[None]:
    """Alice's laptop connected and ``model`` answering, for the tests where a worker gets
    as far as the device; both undone even when the test fails."""
    llm.respond_with(model)
    await world.laptop.online()
    try:
        yield
    finally:
        await world.laptop.offline()
        llm.respond_with(None)


def _grant(row: asyncpg.Record) -> dict[str, Any]:
    grant = row.get("device_grant")
    return _json(grant) if grant is not None else {}


async def cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    done = await asyncio.to_thread(run_cli, database_url, *args)
    assert done.returncode == 0, done.stderr
    return done


# -- Bob, through each entry point ---------------------------------------------------------


async def test_rules_only_run_on_someone_elses_device_runs_nothing(
    world: World, pool: asyncpg.Pool, queue: CommandQueue
) -> None:
    asked = await world.slash(BOB, "@superagent /run alice-laptop touch pwned")
    await _run_effects(pool, queue)
    assert await _commands_on(pool, world.laptop) == 0
    (said,) = await _replies(pool, asked.thread_id)
    assert "alice" in said
    assert "approv" in said
    # His own device is his to use.
    own = await world.slash(BOB, "@superagent /run bob-desktop true", thread="C1/2000.0001")
    await _run_effects(pool, queue)
    assert await _commands_on(pool, world.desktop) == 1
    assert (await _replies(pool, own.thread_id))[0].startswith("Running on bob-desktop")


async def test_create_ticket_on_someone_elses_device_waits_for_the_owner(
    world: World, pool: asyncpg.Pool, queue: CommandQueue
) -> None:
    created, _ = await world.ask_ticket(BOB, "alice-laptop")
    ticket = await _waits_for_alice(world, queue, created["ticket"])
    assert _grant(ticket).get("rule") not in ("owner", "shared", "delegated", "approved")
    # A path that forgot the check (here: SQL) gets nothing queued either.
    await pool.execute(
        "UPDATE tickets SET device_id = $2, device_grant = NULL, state = 'running' WHERE id = $1",
        created["ticket"],
        world.laptop.id,
    )
    await _cannot_queue(queue, world.laptop, created["ticket"])
    # On his own desktop the ticket is his to run, and the check is on record.
    mine, _ = await world.ask_ticket(BOB, "bob-desktop")
    grant = _grant(await _ticket(pool, mine["ticket"]))
    assert (grant["rule"], grant["device_id"]) == ("owner", world.desktop.id)
    assert grant["matched"] == "bob"
    assert grant["at"]


async def test_my_laptop_is_never_matched_by_display_name(world: World) -> None:
    """The impostor's Slack name is "alice": Alice's laptop is not his laptop."""
    request = await world.say(IMPOSTOR, "@superagent fix it on my laptop")
    refused = await world.tools.call(
        "create_ticket",
        {
            "title": "Fix it",
            "scope": "x",
            "threads": [],
            "device": "my laptop",
            "mandate_from": request.trigger_id,
        },
        TURN,
    )
    assert not refused.ok
    assert "owns no paired device" in refused.content["error"]


async def test_a_router_and_worker_never_run_bobs_request_on_alices_laptop(
    world: World, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer, workers: Workers
) -> None:
    """The whole path with a model: the router picks Alice's laptop for Bob, the worker
    tries a command there; nothing reaches the device."""
    from controlplane.router.router import Router

    request = await world.say(BOB, "@superagent run the tests on alice-laptop")

    def model(req: ChatRequest) -> Reply:
        if (req.system_prompt() or "").startswith("You are the router"):
            if req.tool_results():
                return Reply(content="Done.")
            return Reply(
                tool_calls=[
                    ToolCall(
                        "create_ticket",
                        {
                            "title": "run the tests",
                            "scope": "run them",
                            "threads": [],
                            "device": "alice-laptop",
                            "mandate_from": request.trigger_id,
                        },
                    )
                ]
            )
        if not req.tool_results():
            return Reply(tool_calls=[ToolCall("shell", {"command": "touch pwned"})])
        return Reply(tool_calls=[ToolCall("report", {"status": "ready", "summary": "ran"})])

    async with _laptop_online(world, fake_llm, model):
        router = Router(
            pool, fake_llm.async_openai_client(), FAKE_MODEL, policy=world.intake.policy
        )
        assert await router.turn() == 1
        async with workers() as service:
            for _ in range(3):
                service._wake.set()
                await asyncio.sleep(0.5)
        assert world.laptop.ran == []
        assert await _commands_on(pool, world.laptop) == 0


async def test_reroute_to_someone_elses_device_waits_for_the_owner(
    world: World, pool: asyncpg.Pool, queue: CommandQueue
) -> None:
    created, _ = await world.ask_ticket(BOB, "bob-desktop")
    wait = timedelta(seconds=Settings().workers.device_wait_seconds)
    moved = await control.reroute(pool, created["ticket"], "alice-laptop", by="the CLI", wait=wait)
    await _waits_for_alice(world, queue, created["ticket"])
    assert moved.approval is not None
    assert moved.owner == "alice"


async def test_cli_reroute_to_someone_elses_device_waits_for_the_owner(
    world: World, queue: CommandQueue, database_url: str
) -> None:
    created, _ = await world.ask_ticket(BOB, "bob-desktop")
    moved = await cli(database_url, "tickets", "reroute", created["ticket"], "alice-laptop")
    assert "approval" in moved.stdout
    assert "alice" in moved.stdout
    await _waits_for_alice(world, queue, created["ticket"])
    shown = json.loads(
        (await cli(database_url, "tickets", "show", created["ticket"], "--json")).stdout
    )
    assert shown["device_grant"]["rule"] == "pending"
    assert shown["device_grant"]["owner"] == "alice"
    human = (await cli(database_url, "tickets", "show", created["ticket"])).stdout
    approval = shown["device_grant"]["approval"]
    assert f"access:   waits for alice to approve {approval}" in human


async def test_console_reroute_to_someone_elses_device_waits_for_the_owner(
    world: World, pool: asyncpg.Pool, queue: CommandQueue
) -> None:
    from controlplane.console import actions
    from controlplane.console import tickets as ticket_pages

    created, _ = await world.ask_ticket(BOB, "bob-desktop")
    answer = await actions.reroute(Settings(), pool, created["ticket"], "alice-laptop")
    assert "approval" in answer["message"]
    await _waits_for_alice(world, queue, created["ticket"])
    page = await ticket_pages.detail(pool, created["ticket"])
    assert page["device_grant"]["rule"] == "pending"


async def test_the_device_wait_answer_cannot_reroute_to_someone_elses_device(
    world: World, pool: asyncpg.Pool, queue: CommandQueue, workers: Workers
) -> None:
    created, request = await world.ask_ticket(BOB, "bob-desktop")
    ticket_id = created["ticket"]
    # Bob's desktop stayed away past the wait: people were asked to reroute or drop.
    await pool.execute(
        "UPDATE tickets SET state = 'waiting_human', hold = 'device_expired' WHERE id = $1",
        ticket_id,
    )
    await world.say(BOB, "reroute alice-laptop")
    async with workers():
        said = await assert_eventually(
            lambda: _said(pool, request.thread_id, "approval"), timeout=10
        )
    assert "alice" in said
    await _waits_for_alice(world, queue, ticket_id)


async def _said(pool: asyncpg.Pool, thread_id: str, word: str) -> str | None:
    return next((text for text in await _replies(pool, thread_id) if word in text), None)


# -- what does let Bob in ------------------------------------------------------------------


async def test_a_share_lets_bob_and_unsharing_takes_it_back(
    world: World, pool: asyncpg.Pool, queue: CommandQueue, database_url: str
) -> None:
    await cli(database_url, "devices", "share", "alice-laptop", "--with", "bob")
    listed = await cli(database_url, "devices", "list")
    line = next(line for line in listed.stdout.splitlines() if "alice-laptop" in line)
    assert "alice" in line
    assert "bob" in line
    created, _ = await world.ask_ticket(BOB, "alice-laptop")
    ticket = await _ticket(pool, created["ticket"])
    assert ticket["state"] == "open"
    grant = _grant(ticket)
    assert (grant["rule"], grant["matched"]) == ("delegated", "bob")
    command = await queue.submit(world.laptop.id, specs.Exec(["true"]), ticket_id=created["ticket"])
    assert command.startswith("cmd_")
    await world.slash(BOB, "@superagent /run alice-laptop true", thread="C1/3000.0001")
    await _run_effects(pool, queue)
    assert await _commands_on(pool, world.laptop) == 2

    await cli(database_url, "devices", "unshare", "alice-laptop", "--with", "bob")
    # The ticket's authorization rested on the share: its next command is refused.
    await _cannot_queue(queue, world.laptop, created["ticket"])
    again, _ = await world.ask_ticket(BOB, "alice-laptop")
    assert (await _ticket(pool, again["ticket"]))["hold"] == "device_approval"


async def test_owners_and_shares_name_ids_never_handles(database_url: str, world: World) -> None:
    """A GitHub login or a Slack handle can be renamed or re-registered: refused, with how
    to give the id instead."""
    for option in (("--owner", "github:octocat"), ("--shared", "nochannel")):
        refused = await asyncio.to_thread(
            run_cli, database_url, "devices", "pair", "--name", "box", *option
        )
        assert refused.returncode != 0
        assert "id" in refused.stderr or "group" in refused.stderr, refused.stderr
    refused = await asyncio.to_thread(
        run_cli, database_url, "devices", "share", "alice-laptop", "--with", "slack:U0BOB"
    )
    assert refused.returncode != 0
    assert "TEAM/USER" in refused.stderr


async def test_a_team_device_is_usable_by_its_group(
    world: World,
    pool: asyncpg.Pool,
    queue: CommandQueue,
    db: async_sessionmaker[AsyncSession],
    database_url: str,
) -> None:
    from controlplane.db.pool import transaction
    from controlplane.gateway import pairing

    pair = ("devices", "pair", "--name", "ci-box", "--shared", "slack:ops", "--json")
    issued = json.loads((await cli(database_url, *pair)).stdout)
    key = os.urandom(32)
    async with transaction(pool) as conn:  # as endpointd pair does, through the gateway
        attempt = await pairing.count_attempt(
            conn,
            code=issued["code"],
            public_key=key,
            source="127.0.0.1",
            limits=pairing.Limits(per_peer=10, everyone=100),
        )
    async with transaction(pool) as conn:
        device = await pairing.redeem(conn, attempt, public_key=key, version="1", labels={})
        device_id = device.id
    owner = await pool.fetchval("SELECT owner FROM devices WHERE id = $1", device_id)
    assert owner == "web:admin"  # nobody named: the admin who made the code owns it
    ops, _ = await world.ask_ticket(OLGA, "ci-box")
    grant = _grant(await _ticket(pool, ops["ticket"]))
    assert (grant["rule"], grant["matched"]) == ("shared", "group:slack:ops")
    # Bob is not in ops: the owner is asked.
    eng, _ = await world.ask_ticket(BOB, "ci-box")
    assert (await _ticket(pool, eng["ticket"]))["hold"] == "device_approval"


# -- approvals in chat ---------------------------------------------------------------------


async def _asked(
    pool: asyncpg.Pool, thread_id: str, settings: Settings | None = None
) -> tuple[str, str]:
    """The one message to the owner on the request's thread, and its approval id."""
    from controlplane.tickets.consent import ConsentService

    service = ConsentService(pool, settings or Settings())
    await service.pass_once()
    await service.pass_once()  # asked once, however many passes
    asked = [text for text in await _replies(pool, thread_id) if APPROVAL_ID.search(text)]
    assert len(asked) == 1, asked
    found = APPROVAL_ID.search(asked[0])
    assert found is not None
    assert f"deny {found[1]}" in asked[0]
    return asked[0], found[1]


async def _pass(pool: asyncpg.Pool) -> None:
    from controlplane.tickets.consent import ConsentService

    await ConsentService(pool, Settings()).pass_once()


async def test_the_owners_approval_in_chat_lets_the_work_run(
    world: World, pool: asyncpg.Pool, fake_llm: FakeOpenAIServer, workers: Workers
) -> None:
    created, request = await world.ask_ticket(BOB, "alice-laptop")
    ticket_id = created["ticket"]
    text, approval = await _asked(pool, request.thread_id)
    assert "bob" in text
    assert ticket_id in text
    assert "alice-laptop" in text
    assert _grant(await _ticket(pool, ticket_id))["owner"] == "alice"
    seen: list[str] = []

    def worker(req: ChatRequest) -> Reply:
        if not req.tool_results():
            return Reply(tool_calls=[ToolCall("shell", {"command": "echo approved-run"})])
        seen.append(req.text())
        return Reply(tool_calls=[ToolCall("report", {"status": "ready", "summary": "ran"})])

    async with _laptop_online(world, fake_llm, worker):
        async with workers() as service:
            await asyncio.sleep(1.0)
            assert world.laptop.ran == []  # nothing before she answers
            await world.say(ALICE, f"approve {approval}")  # no mention needed
            await _pass(pool)
            service._wake.set()
            await assert_eventually(lambda: world.laptop.ran, timeout=15)
        assert world.laptop.ran[0]["argv"][-1] == "echo approved-run"
        grant = _grant(await _ticket(pool, ticket_id))
        assert (grant["rule"], grant["by"], grant["approval"]) == ("approved", "alice", approval)
        assert any("approved" in said for said in await _replies(pool, request.thread_id))


async def test_the_owners_denial_stops_the_ticket(
    world: World, pool: asyncpg.Pool, queue: CommandQueue
) -> None:
    created, request = await world.ask_ticket(BOB, "alice-laptop")
    _, approval = await _asked(pool, request.thread_id)
    await world.say(ALICE, f"deny {approval}")
    await _pass(pool)
    ticket = await _ticket(pool, created["ticket"])
    assert ticket["state"] == "stopped"
    assert ticket["hold"] == "device approval denied"
    assert any("denied" in said for said in await _replies(pool, request.thread_id))
    await _cannot_queue(queue, world.laptop, created["ticket"])


async def test_no_answer_in_time_stops_the_ticket(
    world: World, pool: asyncpg.Pool, queue: CommandQueue
) -> None:
    from controlplane.tickets.consent import ConsentService

    quick = Settings(workers=WorkerSettings(device_approval_seconds=0.5))
    created, request = await world.ask_ticket(BOB, "alice-laptop")
    _, approval = await _asked(pool, request.thread_id, quick)
    await asyncio.sleep(0.6)
    await ConsentService(pool, quick).pass_once()
    ticket = await _ticket(pool, created["ticket"])
    assert (ticket["state"], ticket["hold"]) == ("stopped", "device approval expired")
    assert any("no answer" in said.lower() for said in await _replies(pool, request.thread_id))
    # A late approval changes nothing.
    await world.say(ALICE, f"approve {approval}")
    await _pass(pool)
    assert (await _ticket(pool, created["ticket"]))["state"] == "stopped"
    await _cannot_queue(queue, world.laptop, created["ticket"])


async def test_an_approval_from_anyone_but_the_owner_is_ignored_and_recorded(
    world: World, pool: asyncpg.Pool, queue: CommandQueue
) -> None:
    created, request = await world.ask_ticket(BOB, "alice-laptop")
    _, approval = await _asked(pool, request.thread_id)
    by_bob = await world.say(BOB, f"approve {approval}")
    by_name = await world.say(IMPOSTOR, f"@superagent approve {approval}")
    await _pass(pool)
    await _waits_for_alice(world, queue, created["ticket"])
    answers = {
        row["trigger_id"]: row
        for row in await pool.fetch(
            "SELECT trigger_id, approval_id, outcome, reason FROM approval_answers"
        )
    }
    for trigger in (by_bob, by_name):
        assert answers[trigger.trigger_id]["approval_id"] == approval
        assert answers[trigger.trigger_id]["outcome"] == "ignored"
        assert "alice" in answers[trigger.trigger_id]["reason"]


async def test_a_rules_only_run_approved_by_the_owner_runs_once(
    world: World, pool: asyncpg.Pool, queue: CommandQueue
) -> None:
    asked = await world.slash(BOB, "@superagent /run alice-laptop echo hi")
    _, approval = await _asked(pool, asked.thread_id)
    await _run_effects(pool, queue)
    assert await _commands_on(pool, world.laptop) == 0
    await world.say(ALICE, f"approve {approval}")
    await _pass(pool)
    await _pass(pool)
    await _run_effects(pool, queue)
    await _run_effects(pool, queue)
    assert await _commands_on(pool, world.laptop) == 1
