"""The repositories a device reports, through the real gateway: stored for the device whose
stream they came on, replaced by its next report, cut and cleaned when the device is
hostile, and absent (without harm) when its daemon predates the report. Admins see them in
``superagent devices show`` and on the console's Devices page."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import asyncpg
import pytest
from playwright.async_api import expect

from controlplane.console import devices as console_devices
from controlplane.gateway import repositories, specs
from controlplane.gateway.repositories import MAX_REPOSITORIES, owner_name
from superagent_proto.v1 import endpoint_pb2 as pb
from superagent_shared.ids import new_id
from superagent_shared.messages import Repository, RepositoryReport
from tests.support.console_browser import chromium, screenshot
from tests.support.console_replica import Replica, replica_fixture, sign_in, up  # noqa: F401
from tests.support.gateway_harness import (  # noqa: F401 - fixtures
    FakeDevice,
    Gateway,
    connected,
    gateway_fixture,
)
from tests.support.helpers import assert_eventually, run_cli


def _clone(path: str, remote: str = "", branch: str = "main") -> pb.Repository:
    return pb.Repository(path=path, remote=remote, default_branch=branch)


async def _report(device: FakeDevice, *clones: pb.Repository, truncated: bool = False) -> None:
    await device.send(
        repositories=pb.RepositoryReport(repositories=list(clones), truncated=truncated)
    )


async def _stored(pool: asyncpg.Pool, device_id: str) -> list[tuple[str, str | None, str | None]]:
    rows = await pool.fetch(
        "SELECT path, owner_name, default_branch FROM device_repositories "
        "WHERE device_id = $1 ORDER BY path",
        device_id,
    )
    return [(r["path"], r["owner_name"], r["default_branch"]) for r in rows]


async def _still_works(gateway: Gateway, device: FakeDevice) -> None:
    """The stream carries a command end to end after whatever the device sent."""
    command_id = await gateway.queue.submit(device.device_id, specs.Exec(["true"]))
    delivered = (await device.next("command")).command
    assert delivered.command_id == command_id
    await device.send(accepted=pb.Accepted(command_id=command_id))
    await device.send(finished=pb.Finished(command_id=command_id, exit_code=0))
    assert (await gateway.queue.wait(command_id, timeout=10)).ok


async def test_a_report_is_stored_for_its_device_and_replaced_by_the_next(
    gateway: Gateway, database_url: str
) -> None:
    pool = gateway.pool
    async with connected(gateway, "laptop") as laptop, connected(gateway, "desktop") as desktop:
        await _report(
            laptop,
            _clone("/home/alice/src/app", "github.com/Acme/App"),
            _clone("/home/alice/src/lib", "github.com/acme/lib", "trunk"),
            _clone("/home/alice/scratch", ""),  # a clone with no remote: kept, not routable
        )
        await _report(desktop, _clone("/srv/app", "git.internal:acme/app.git", "develop"))
        expected_laptop = [
            ("/home/alice/scratch", None, "main"),
            ("/home/alice/src/app", "acme/app", "main"),
            ("/home/alice/src/lib", "acme/lib", "trunk"),
        ]
        await assert_eventually(
            lambda: _equal(_stored(pool, laptop.device_id), expected_laptop),
            message="the laptop's report was not stored",
        )
        await assert_eventually(
            lambda: _equal(_stored(pool, desktop.device_id), [("/srv/app", "acme/app", "develop")])
        )
        # The next report replaces the last one, whole; the other device's stay.
        await _report(laptop, _clone("/home/alice/work/app", "github.com/acme/app"))
        await assert_eventually(
            lambda: _equal(
                _stored(pool, laptop.device_id), [("/home/alice/work/app", "acme/app", "main")]
            )
        )
        assert await _stored(pool, desktop.device_id) == [("/srv/app", "acme/app", "develop")]
        # An empty report: the device has none now.
        await _report(laptop)
        await assert_eventually(lambda: _equal(_stored(pool, laptop.device_id), []))
        reported = await pool.fetchval(
            "SELECT repositories_reported_at FROM devices WHERE id = $1", laptop.device_id
        )
        assert reported is not None
        await _still_works(gateway, laptop)

        await _report(desktop, _clone("/srv/app", "github.com/acme/app"), truncated=True)
        await assert_eventually(
            lambda: pool.fetchval(
                "SELECT repositories_truncated FROM devices WHERE id = $1", desktop.device_id
            )
        )
        shown = await asyncio.to_thread(run_cli, database_url, "devices", "show", "desktop")
        assert shown.returncode == 0, shown.stderr
        assert "1, reported" in shown.stdout
        assert "there may be more" in shown.stdout
        line = next(li for li in shown.stdout.splitlines() if "/srv/app" in li)
        assert line.split() == ["acme/app", "main", "/srv/app", "github.com/acme/app"]

        listed = await _console_devices(pool)
        assert [r["path"] for r in listed["desktop"]["repositories"]] == ["/srv/app"]
        assert listed["desktop"]["repositories"][0]["owner_name"] == "acme/app"
        assert listed["laptop"]["repositories"] == []
        assert listed["laptop"]["repositories_reported_at"] is not None


async def test_a_hostile_report_is_cut_and_cleaned_and_the_stream_lives_on(
    gateway: Gateway, database_url: str
) -> None:
    """More clones than anyone has, and entries no endpointd sends: the good ones are kept
    (at most MAX_REPOSITORIES), the rest dropped, and the stream goes on working."""
    pool = gateway.pool
    garbage = [
        _clone("relative/path", "github.com/acme/x"),
        _clone("", "github.com/acme/x"),
        _clone("/nul\x00byte", "github.com/acme/x"),
        _clone("/escape\x1b[2J", "github.com/acme/x"),
        _clone("/" + "p" * 5000, "github.com/acme/x"),
        _clone("/remote/newline", "github.com/acme/x\nevil"),
        _clone("/remote/long", "github.com/acme/" + "x" * 600),
        _clone("/branch/space", "github.com/acme/x", "main; rm -rf /"),
        _clone("/branch/long", "github.com/acme/x", "b" * 300),
        _clone("/ok/first", "github.com/acme/ok"),
        _clone("/ok/first", "github.com/acme/twice"),  # the same path again
        _clone("/odd/remote", "github.com/../.."),  # kept, but names no repository
    ]
    flood = [_clone(f"/flood/{n:05d}", f"github.com/acme/r{n}") for n in range(1500)]
    async with connected(gateway) as device:
        await _report(device, *garbage, *flood)
        await assert_eventually(
            lambda: pool.fetchval(
                "SELECT repositories_reported_at FROM devices WHERE id = $1", device.device_id
            ),
            message="the report was not stored",
        )
        stored = await _stored(pool, device.device_id)
        assert len(stored) == MAX_REPOSITORIES
        kept = {path: owner for path, owner, _ in stored}
        assert kept["/ok/first"] == "acme/ok"
        assert kept["/odd/remote"] is None
        assert not [p for p in kept if not (p.startswith(("/ok/", "/odd/", "/flood/")))]
        assert (
            await pool.fetchval(
                "SELECT repositories_truncated FROM devices WHERE id = $1", device.device_id
            )
            is True
        )
        await _still_works(gateway, device)
        shown = await asyncio.to_thread(run_cli, database_url, "devices", "show", "laptop")
        assert shown.returncode == 0, shown.stderr
        assert "\x1b" not in shown.stdout


async def test_a_daemon_that_never_reports_connects_works_and_has_none(
    gateway: Gateway, database_url: str
) -> None:
    """An endpointd older than the report: nothing stored, nothing broken, and admins are
    told why there is nothing rather than shown an empty list as if it had none."""
    async with connected(gateway) as device:
        await _still_works(gateway, device)
        assert await _stored(gateway.pool, device.device_id) == []
        shown = await asyncio.to_thread(run_cli, database_url, "devices", "show", "laptop")
        assert shown.returncode == 0, shown.stderr
        assert "none reported (its endpointd predates the report" in shown.stdout
        data = json.loads(
            (
                await asyncio.to_thread(
                    run_cli, database_url, "devices", "show", device.device_id, "--json"
                )
            ).stdout
        )
        assert (data["repositories"], data["repositories_reported_at"]) == ([], None)


async def test_the_console_devices_page_lists_them_as_text(
    replica: Replica, pool: asyncpg.Pool
) -> None:
    """In a real browser: each device's clones, and who never reported; a path that looks
    like markup (printable, so kept) is shown as text, never run."""
    url = await up(replica)
    laptop, old_box = new_id("dev"), new_id("dev")
    await pool.execute(
        "INSERT INTO devices (id, name, owner) VALUES ($1, 'laptop', 'alice'), "
        "($2, 'old-box', 'alice')",
        laptop,
        old_box,
    )
    trap = "/home/alice/<img src=x onerror=alert(1)>"
    await repositories.replace(
        pool,
        laptop,
        RepositoryReport(
            (
                Repository("/home/alice/src/app", "github.com/acme/app", "main"),
                Repository(trap, "", ""),
            ),
            truncated=False,
            scanned_at=None,
        ),
    )
    async with chromium() as browser:
        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("dialog", lambda dialog: errors.append(f"dialog: {dialog.message}"))
        await sign_in(page, url, "/console/devices")
        section = page.locator("#repositories")
        app = section.locator("tr", has_text="/home/alice/src/app")
        for shown in ("laptop", "acme/app", "main", "github.com/acme/app"):
            await expect(app).to_contain_text(shown)
        await expect(section.locator("tr", has_text="onerror")).to_contain_text(trap)
        await expect(section).to_contain_text("Not reported by old-box")
        await expect(section.locator("img")).to_have_count(0)
        await screenshot(page, "devices-repositories")
    assert errors == []


async def _equal(rows: Any, expected: Sequence[tuple[str, str | None, str | None]]) -> bool:
    return bool(await rows == expected)


async def _console_devices(pool: asyncpg.Pool) -> dict[str, dict[str, Any]]:
    """The console's Devices page data (what ``/console/api/devices`` answers), by name."""
    listed = await console_devices.listing(pool)
    return {d["name"]: d for d in listed["devices"]}


@pytest.mark.parametrize(
    ("remote", "expected"),
    [
        ("github.com/Acme/App", "acme/app"),
        ("git@github.com:acme/app.git", "acme/app"),
        ("https://user@github.example.com:8443/acme/app/", "acme/app"),
        ("github-work:acme/app", "acme/app"),  # an SSH alias: the host is not compared
        ("gitlab.com/group/sub/app", "sub/app"),
        ("github.com", None),
        ("github.com/acme/..", None),
        ("github.com/acme/app name", None),
    ],
)
def test_a_remote_names_its_repository_by_owner_and_name(remote: str, expected: str | None) -> None:
    assert owner_name(remote) == expected
