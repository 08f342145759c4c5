"""``superagent devices show``: one device and the repositories it reports, as an admin
reads them in a terminal (and as a script reads ``--json``)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import asyncpg

from controlplane.gateway import repositories
from superagent_shared.ids import new_id
from superagent_shared.messages import Repository, RepositoryReport
from tests.support.cli_output import one_line_error
from tests.support.helpers import run_cli


async def _device(pool: asyncpg.Pool, name: str, *, revoked: bool = False) -> str:
    device_id = new_id("dev")
    await pool.execute(
        "INSERT INTO devices (id, name, owner, version, connected_replica, connected_at, "
        "last_seen_at, revoked_at) VALUES ($1, $2, 'alice', '0.2.0', 'replica-a', now(), now(), "
        "CASE WHEN $3 THEN now() END)",
        device_id,
        name,
        revoked,
    )
    return device_id


async def _show(database_url: str, *args: str) -> str:
    done = await asyncio.to_thread(run_cli, database_url, "devices", "show", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_show_lists_the_reported_repositories(pool: asyncpg.Pool, database_url: str) -> None:
    await _device(pool, "laptop", revoked=True)  # an older laptop of the same name
    laptop = await _device(pool, "laptop")
    await repositories.replace(
        pool,
        laptop,
        RepositoryReport(
            repositories=(
                Repository("/home/alice/src/app", "github.com/acme/app", "main"),
                Repository("/home/alice/My Projects/lib", "gitlab.example.com/acme/lib", "trunk"),
                Repository("/home/alice/notes", "", ""),
            ),
            truncated=False,
            scanned_at=datetime.now(UTC).timestamp(),
        ),
    )
    text = await _show(database_url, "laptop")
    assert f"laptop ({laptop})" in text  # the active one, not the revoked one
    assert "repositories: 3, reported" in text
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("REPOSITORY"))
    assert lines[header].split() == ["REPOSITORY", "DEFAULT", "BRANCH", "PATH", "REMOTE"]
    rows = lines[header + 1 :]
    assert "/home/alice/My Projects/lib" in rows[0]  # a path with a space, whole
    assert rows[0].split()[:2] == ["acme/lib", "trunk"]
    assert rows[0].split()[-1] == "gitlab.example.com/acme/lib"
    assert rows[1].split() == ["-", "-", "/home/alice/notes", "-"]
    assert rows[2].split() == ["acme/app", "main", "/home/alice/src/app", "github.com/acme/app"]

    shown = json.loads(await _show(database_url, laptop, "--json"))
    assert shown["id"] == laptop
    assert [r["path"] for r in shown["repositories"]] == [
        "/home/alice/My Projects/lib",
        "/home/alice/notes",
        "/home/alice/src/app",
    ]
    app = shown["repositories"][2]
    assert (app["remote"], app["owner_name"], app["default_branch"]) == (
        "github.com/acme/app",
        "acme/app",
        "main",
    )
    assert app["reported_at"]


async def test_show_says_why_a_device_has_none(pool: asyncpg.Pool, database_url: str) -> None:
    """Never reported (an older endpointd) and reported none are told apart."""
    old = await _device(pool, "old-box")
    new = await _device(pool, "new-box")
    await repositories.replace(pool, new, RepositoryReport((), truncated=False, scanned_at=None))
    assert "none reported (its endpointd predates the report" in await _show(database_url, old)
    assert "none under its allowed roots, reported" in await _show(database_url, "new-box")


async def test_an_unknown_device_is_one_clear_line(pool: asyncpg.Pool, database_url: str) -> None:
    done = await asyncio.to_thread(run_cli, database_url, "devices", "show", "nope")
    assert "no device named or with id 'nope'" in one_line_error(done)
