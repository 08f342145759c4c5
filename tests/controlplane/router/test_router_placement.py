"""A ticket for a known repository goes to a device chosen in code: one that reports a clone
of it and that the requester may use, their own first, online first; the requester is
asked when the choice is theirs, and a device they may not use is never picked.

Real Postgres, the real gateway (each device connects and reports its clones over the
protocol, and goes offline by closing its stream), and the router's tools as the model
calls them; one test drives a whole router turn against the fake model.

The world: alice asks on acme/app#N (a GitHub thread, whose own repository is acme/app).
``alice-laptop`` is hers and has a clone; ``team-box`` is carol's, shared with alice, and
has one; ``bob-desktop`` is bob's and has only acme/lib.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.gateway import authorization as access
from controlplane.ingest.admission import (
    Admission,
    DevicePlacement,
    OfflineOwnerDevice,
    SourceAdmission,
)
from controlplane.ingest.intake import Intake
from controlplane.router.router import Router
from controlplane.router.tools.core import Turn
from controlplane.router.tools.toolbox import Toolbox
from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_shared.ids import new_id
from tests.fakes.openai_server import FAKE_MODEL, ChatRequest, FakeOpenAIServer, Reply
from tests.support.gateway_harness import FakeDevice, Gateway, pairing_code, running_gateway
from tests.support.helpers import assert_eventually, save_policy
from tests.support.router_harness import ALICE, ask, tickets_for_batch

TURN = Turn(session_id=None, llm_call_id=None, batch=())
ALICE_CLONE = "/home/alice/src/app"
TEAM_CLONE = "/srv/checkouts/app"


def _policy(offline_owner_device: OfflineOwnerDevice = "shared") -> Admission:
    return Admission(
        default=SourceAdmission(users=[ALICE.id]),
        routing=DevicePlacement(offline_owner_device=offline_owner_device),
    )


@dataclass
class World:
    gateway: Gateway
    pool: asyncpg.Pool
    intake: Intake
    tools: Toolbox
    devices: dict[str, FakeDevice] = field(default_factory=dict)
    _n: int = 0

    async def device(self, name: str, owner: str, *clones: tuple[str, str]) -> FakeDevice:
        """``name``, paired for ``owner``, connected, and reporting ``clones`` (path,
        remote); back once the report is stored."""
        device = FakeDevice(self.gateway)
        await device.pair(await pairing_code(self.pool, name, owner=owner))
        self.devices[name] = device
        await self.connect(name)
        await self.report(name, *clones)
        return device

    async def report(self, name: str, *clones: tuple[str, str]) -> None:
        """``name`` reports exactly ``clones``; back once they are stored."""
        device = self.devices[name]
        await device.send(
            repositories=pb.RepositoryReport(
                repositories=[
                    pb.Repository(path=path, remote=remote, default_branch="main")
                    for path, remote in clones
                ]
            )
        )

        async def stored() -> bool:
            paths = await self.pool.fetch(
                "SELECT path FROM device_repositories WHERE device_id = $1", device.device_id
            )
            reported = await self.pool.fetchval(
                "SELECT repositories_reported_at FROM devices WHERE id = $1", device.device_id
            )
            return reported is not None and {p["path"] for p in paths} == {p for p, _ in clones}

        await assert_eventually(stored, message=f"{name}'s report was not stored")

    async def connect(self, name: str) -> None:
        device = self.devices[name]
        await device.connect()
        await assert_eventually(lambda: device.device_id in self.gateway.hub.streams)

    async def disconnect(self, name: str) -> None:
        device = self.devices[name]
        await device.close()
        await assert_eventually(
            lambda: self._offline(device.device_id), message=f"{name} never went offline"
        )

    async def _offline(self, device_id: str) -> bool:
        replica = await self.pool.fetchval(
            "SELECT connected_replica FROM devices WHERE id = $1", device_id
        )
        return replica is None

    async def routing(self, offline_owner_device: OfflineOwnerDevice) -> None:
        await save_policy(self.pool, _policy(offline_owner_device))
        self.intake.policy.forget()

    async def request(self, device: str | None = None, **more: Any) -> tuple[bool, dict[str, Any]]:
        """alice asks for work on a new acme/app issue; the model leaves ``device`` as given."""
        self._n += 1
        asked = await ask(self.intake, self._n)
        result = await self.tools.call(
            "create_ticket",
            {
                "title": "fix it",
                "scope": "as asked",
                "threads": [],
                "device": device,
                "mandate_from": asked.trigger_id,
                **more,
            },
            TURN,
        )
        return result.ok, result.content

    async def ticket(self, ticket_id: str) -> asyncpg.Record:
        row = await self.pool.fetchrow(
            "SELECT t.device_id, d.name AS device, t.workdir, t.repo, t.device_grant "
            "FROM tickets t LEFT JOIN devices d ON d.id = t.device_id WHERE t.id = $1",
            ticket_id,
        )
        assert row is not None
        return row


def _rule(ticket: asyncpg.Record) -> str | None:
    """What lets the ticket's requester use its device (owner, delegated, pending...)."""
    grant = access.loads(ticket["device_grant"])
    return None if grant is None else grant.get("rule")


@pytest.fixture
async def world(
    db: async_sessionmaker[AsyncSession], database_url: str, tmp_path: Path
) -> AsyncIterator[World]:
    async with running_gateway(database_url, db, tmp_path) as gateway:
        pool = gateway.pool
        await save_policy(pool, _policy())
        for person in ("alice", "bob", "carol"):
            await pool.execute(
                "INSERT INTO people (id, name) VALUES ($1, $2)", new_id("prs"), person
            )
        # alice's GitHub account is hers (superagent users link alice github:u-1).
        await pool.execute(
            "INSERT INTO accounts (source, handle, person_id) "
            "SELECT 'github', $1, id FROM people WHERE name = 'alice'",
            ALICE.id,
        )
        intake = Intake(pool)
        world = World(gateway, pool, intake, Toolbox(pool, intake.policy))
        try:
            await world.device("alice-laptop", "alice", (ALICE_CLONE, "github.com/acme/app"))
            team = await world.device(
                "team-box", "carol", (TEAM_CLONE, "git@github.com:Acme/App.git")
            )
            await access.share(pool, team.device_id, "alice", by="test")
            await world.device("bob-desktop", "bob", ("/home/bob/lib", "github.com/acme/lib"))
            yield world
        finally:
            for device in world.devices.values():
                with contextlib.suppress(Exception):
                    await device.close()


async def test_the_requesters_own_device_with_the_repository_is_chosen_then_the_policy_decides(
    world: World,
) -> None:
    ok, content = await world.request()
    assert ok, content
    ticket = await world.ticket(content["ticket"])
    assert (ticket["device"], ticket["workdir"], ticket["repo"]) == (
        "alice-laptop",
        ALICE_CLONE,
        "acme/app",
    )
    assert _rule(ticket) == "owner"
    assert content["placed"]["workdir"] == ALICE_CLONE

    await world.disconnect("alice-laptop")
    # The default ("shared"): the online device shared with her that has it.
    ok, content = await world.request()
    assert ok, content
    ticket = await world.ticket(content["ticket"])
    assert (ticket["device"], ticket["workdir"]) == ("team-box", TEAM_CLONE)
    assert _rule(ticket) == "delegated"
    assert "their own is offline" in content["placed"]["device"]

    # "ask": nothing is created; the router is told whom to ask about what.
    await world.routing("ask")
    tickets_before = await world.pool.fetchval("SELECT count(*) FROM tickets")
    ok, content = await world.request()
    assert not ok
    assert "alice-laptop (the requester's own, offline)" in content["error"]
    assert "team-box (carol's, shared with the requester, online)" in content["error"]
    assert "bob-desktop" not in content["error"]
    assert await world.pool.fetchval("SELECT count(*) FROM tickets") == tickets_before

    # "wait": her own device, offline; the ticket waits for it.
    await world.routing("wait")
    ok, content = await world.request()
    assert ok, content
    ticket = await world.ticket(content["ticket"])
    assert (ticket["device"], ticket["workdir"]) == ("alice-laptop", ALICE_CLONE)

    # Back online: hers again, whatever the policy.
    await world.routing("shared")
    await world.connect("alice-laptop")
    ok, content = await world.request()
    ticket = await world.ticket(content["ticket"])
    assert ticket["device"] == "alice-laptop"


async def test_a_device_the_requester_may_not_use_is_never_picked(world: World) -> None:
    """bob's desktop now has acme/app too, online, and alice's own device is offline and
    carol unshares hers: nothing alice may use has it, so no device is chosen. Bob's is
    named to the router (asking for it by name asks bob), never picked."""
    await world.report("bob-desktop", ("/home/bob/app", "github.com/acme/app"))
    await world.disconnect("alice-laptop")
    await access.unshare(world.pool, "team-box", "alice")
    for policy in ("shared", "wait"):
        await world.routing(policy)
        ok, content = await world.request()
        assert ok, content
        ticket = await world.ticket(content["ticket"])
        assert ticket["device"] == "alice-laptop"  # hers, offline: never bob's
    # Her laptop comes back without the clone: no device she may use has one.
    await world.connect("alice-laptop")
    await world.report("alice-laptop")
    ok, content = await world.request()
    assert ok, content
    ticket = await world.ticket(content["ticket"])
    assert ticket["device_id"] is None
    assert "bob-desktop (bob's, not shared with the requester, online)" in content["no_device"]

    # Named explicitly, bob's device is still only asked of bob; its clone is recorded.
    ok, content = await world.request("bob-desktop")
    assert ok, content
    assert content["waits_for_approval"]["owner"] == "bob"
    ticket = await world.ticket(content["ticket"])
    assert (ticket["device"], ticket["workdir"]) == ("bob-desktop", "/home/bob/app")


async def test_equally_good_devices_make_the_router_ask_and_a_named_device_wins(
    world: World,
) -> None:
    await world.device("alice-desktop", "alice", ("/home/alice/code/app", "github.com/acme/app"))
    ok, content = await world.request()
    assert not ok
    assert "several of their own devices have it" in content["error"]
    for name in ("alice-laptop", "alice-desktop"):
        assert f"{name} (the requester's own, online)" in content["error"]

    # A named device wins, and is checked as always; its own clone becomes the workdir.
    ok, content = await world.request("team-box")
    assert ok, content
    ticket = await world.ticket(content["ticket"])
    assert (ticket["device"], ticket["workdir"]) == ("team-box", TEAM_CLONE)
    # "my …" with several of hers: the one with a clone of the repository.
    await world.report("alice-desktop")
    ok, content = await world.request("my machine")
    assert ok, content
    assert (await world.ticket(content["ticket"]))["device"] == "alice-laptop"
    # An explicit workdir wins over the clone.
    ok, content = await world.request(workdir="/home/alice/elsewhere")
    assert ok, content
    assert (await world.ticket(content["ticket"]))["workdir"] == "/home/alice/elsewhere"


async def test_a_router_turn_leaving_the_device_empty_lands_on_the_requesters_device(
    world: World, fake_llm: FakeOpenAIServer
) -> None:
    """The model is told it may leave the device empty when the repository is known, and
    doing so puts the ticket on alice's device, in her clone."""
    router = Router(
        world.pool, fake_llm.async_openai_client(), FAKE_MODEL, policy=world.intake.policy
    )

    def answer(request: ChatRequest) -> Reply:
        if request.tool_results():
            return Reply(content="Done.")
        return tickets_for_batch(request)  # device: None

    fake_llm.respond_with(answer)
    await ask(world.intake, 100)
    assert await router.turn() == 1
    (request, *_) = fake_llm.chat_requests
    assert "leave device empty" in (request.system_prompt() or "")
    ticket_id = await world.pool.fetchval("SELECT ticket_id FROM mandates")
    ticket = await world.ticket(ticket_id)
    assert (ticket["device"], ticket["workdir"]) == ("alice-laptop", ALICE_CLONE)
