"""The real endpointd against the real gateway: its repositories stored for routing beside
a device whose older daemon never reports any, and a workspace prepared and released
through the command queue as the workers use it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.gateway import specs
from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_shared import branches
from tests.endpointd.workspaces.device_world import REPO, make_clone, origin_rewrite
from tests.support.daemon import Daemon
from tests.support.gateway_harness import Gateway, connected, running_gateway
from tests.support.helpers import assert_eventually

TICKET = "tkt_gggggggggggg"


@pytest.fixture
async def gateway(
    db: async_sessionmaker[AsyncSession], database_url: str, tmp_path: Path
) -> AsyncIterator[Gateway]:
    async with running_gateway(database_url, db, tmp_path / "cp") as gw:
        yield gw


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    # The origin make_clone makes, reachable by its https URL (see device_world).
    for name, value in origin_rewrite(tmp_path / "origin.git").items():
        monkeypatch.setenv(name, value)
    home = tmp_path.parent / f"{tmp_path.name}.device"
    home.mkdir()
    instance = Daemon(home, work=tmp_path / "work")
    yield instance
    instance.stop_all()


async def _clones(gateway: Gateway, name: str) -> list[tuple[str, str | None, str | None]]:
    rows = await gateway.pool.fetch(
        "SELECT r.path, r.owner_name, r.default_branch FROM device_repositories r"
        " JOIN devices d ON d.id = r.device_id WHERE d.name = $1 ORDER BY r.path",
        name,
    )
    return [(r["path"], r["owner_name"], r["default_branch"]) for r in rows]


async def test_reported_repositories_are_stored_beside_an_older_daemon_that_reports_none(
    gateway: Gateway, daemon: Daemon, tmp_path: Path
) -> None:
    _, clone = make_clone(tmp_path)
    code = await gateway.pairing_code("laptop")
    paired = await daemon.pair(
        f"https://127.0.0.1:{gateway.port}", code, "--fingerprint", gateway.tls.fingerprint
    )
    assert paired.returncode == 0, paired.stderr
    daemon.start()
    async with connected(gateway, "old-laptop") as old:
        # The older daemon (the harness's client never sends a report) works as before.
        command_id = await gateway.queue.submit(old.device_id, specs.Exec(["true"]))
        delivered = (await old.next("command")).command
        await old.send(accepted=pb.Accepted(command_id=delivered.command_id))
        await old.send(finished=pb.Finished(command_id=delivered.command_id, exit_code=0))
        assert (await gateway.queue.wait(command_id, timeout=10)).ok

        async def stored() -> bool:
            return await _clones(gateway, "laptop") == [(str(clone), "acme/app", "main")]

        await assert_eventually(stored, timeout=30, message=daemon.log())
        assert await _clones(gateway, "old-laptop") == []
        reported = await gateway.pool.fetchval(
            "SELECT repositories_reported_at FROM devices WHERE name = 'old-laptop'"
        )
        assert reported is None

    # The workers' way: prepare through the queue, read the answer, release.
    command_id = await gateway.queue.submit("laptop", specs.PrepareWorkspace(TICKET, repo=REPO))
    result = await gateway.queue.wait(command_id, timeout=60)
    assert result.ok, (result, daemon.log()[-3000:])
    answer = json.loads(await gateway.queue.output(command_id))
    workspace = daemon.home / "data" / "workspaces" / TICKET
    assert (answer["path"], answer["branch"], answer["in_place"]) == (
        str(workspace),
        branches.ticket_branch(TICKET),
        False,
    )
    assert (workspace / "README.md").read_text() == "widgets\n"
    command_id = await gateway.queue.submit("laptop", specs.ReleaseWorkspace(TICKET))
    assert (await gateway.queue.wait(command_id, timeout=30)).ok
