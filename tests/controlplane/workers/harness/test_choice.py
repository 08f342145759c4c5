"""Who works a ticket: a person's ask, the repository's config, the device's default, else
the built-in worker; and only ever a harness the device reported as installed and allowed."""

from __future__ import annotations

import os
from typing import Any

import asyncpg

from controlplane.gateway.repositories import checked_harnesses, replace
from controlplane.tickets import store
from controlplane.workers.harness import choice
from controlplane.workers.harness.repo_config import RepoConfig, parse
from superagent_shared.ids import new_id
from superagent_shared.messages import Harness, RepositoryReport


async def _device(pool: asyncpg.Pool, harnesses: list[dict[str, Any]] | None, default: str) -> str:
    device_id = new_id("dev")
    await pool.execute(
        "INSERT INTO devices (id, name, owner, public_key, version, harnesses, default_harness) "
        "VALUES ($1, $2, 'web:alice', $3, '1', $4, $5)",
        device_id,
        f"dev-{device_id[-6:]}",
        os.urandom(32),
        harnesses,
        default,
    )
    return device_id


async def _ticket(pool: asyncpg.Pool, device_id: str, harness: str | None = None) -> str:
    ticket_id = new_id("tkt")
    async with pool.acquire() as conn:
        await store.create(
            conn,
            ticket_id,
            title="t",
            device_id=device_id,
            repo="acme/widgets",
            workdir=None,
            speculative=False,
            harness=harness,
        )
    return ticket_id


QWEN = {"name": "qwen", "version": "0.24.4", "allowed": True, "logged_in": True}
CODEX = {"name": "codex", "version": "0.171.0", "allowed": True, "logged_in": True}
CLAUDE_NOT_ALLOWED = {"name": "claude", "version": "2.1", "allowed": False, "logged_in": True}


async def test_the_order_is_person_then_repository_then_device_then_builtin(
    pool: asyncpg.Pool,
) -> None:
    device = await _device(pool, [QWEN, CODEX, CLAUDE_NOT_ALLOWED], "codex")
    # A person's ask wins.
    asked = await _ticket(pool, device, "qwen")
    got = await choice.choose(pool, asked, device, "laptop", RepoConfig(harness="codex"))
    assert (got.name, got.problem) == ("qwen", None)
    # Then the repository's, then the device's default; each recorded on the ticket.
    by_repo = await _ticket(pool, device)
    got = await choice.choose(pool, by_repo, device, "laptop", RepoConfig(harness="qwen"))
    assert got.name == "qwen"
    assert await pool.fetchval("SELECT harness FROM tickets WHERE id = $1", by_repo) == "qwen"
    by_device = await _ticket(pool, device)
    got = await choice.choose(pool, by_device, device, "laptop", RepoConfig())
    assert got.name == "codex"
    # Once chosen, kept: the repository changing its mind later moves nothing.
    got = await choice.choose(pool, by_device, device, "laptop", RepoConfig(harness="qwen"))
    assert got.name == "codex"
    # A repository naming one the owner did not allow falls through, never forces it.
    plain = await _device(pool, [QWEN, CLAUDE_NOT_ALLOWED], "")
    ticket = await _ticket(pool, plain)
    got = await choice.choose(pool, ticket, plain, "laptop", RepoConfig(harness="claude"))
    assert got.name == choice.BUILTIN


async def test_a_person_asking_for_a_harness_the_device_cannot_run_hears_why(
    pool: asyncpg.Pool,
) -> None:
    device = await _device(pool, [QWEN, CLAUDE_NOT_ALLOWED], "")
    not_allowed = await _ticket(pool, device, "claude")
    got = await choice.choose(pool, not_allowed, device, "laptop", RepoConfig())
    assert got.problem is not None
    assert '[harness] allowed = ["claude"]' in got.problem
    missing = await _ticket(pool, device, "codex")
    got = await choice.choose(pool, missing, device, "laptop", RepoConfig())
    assert got.problem is not None
    assert "no codex installed" in got.problem
    # A daemon that never reported harnesses runs none.
    old = await _device(pool, None, "")
    ticket = await _ticket(pool, old, "qwen")
    got = await choice.choose(pool, ticket, old, "old-laptop", RepoConfig())
    assert got.problem is not None


async def test_a_device_report_is_stored_only_as_well_formed_harnesses(pool: asyncpg.Pool) -> None:
    device = await _device(pool, None, "")
    report = RepositoryReport(
        repositories=(),
        truncated=False,
        scanned_at=None,
        harnesses=(
            Harness("qwen", "0.24.4\x1b[31m" + "9" * 500, True, True),
            Harness("qwen", "again", False, False),  # twice: the first counts
            Harness("../../etc", "1", True, True),
            Harness("Codex; rm -rf /", "1", True, True),
            *(Harness(f"h{i}", "1", True, True) for i in range(40)),
        ),
        default_harness="evil",  # not among them: no default
    )
    await replace(pool, device, report)
    row = await pool.fetchrow(
        "SELECT harnesses, default_harness FROM devices WHERE id = $1", device
    )
    assert row is not None
    names = [h["name"] for h in row["harnesses"]]
    assert names[0] == "qwen"
    assert "../../etc" not in names
    assert "Codex; rm -rf /" not in names
    assert len(names) <= 20
    assert row["harnesses"][0]["allowed"] is True
    assert "\x1b" not in row["harnesses"][0]["version"]
    assert len(row["harnesses"][0]["version"]) <= 100
    assert row["default_harness"] == ""
    rows, default = checked_harnesses(
        RepositoryReport((), False, None, (Harness("codex", "1", True, False),), "codex")
    )
    assert default == "codex"
    assert rows == [{"name": "codex", "version": "1", "allowed": True, "logged_in": False}]


def test_the_repository_config_is_read_leniently() -> None:
    assert parse(None) == RepoConfig()
    got = parse(
        '[harness]\ndefault = "qwen"\n[checks]\ntest = "make test"\n[push]\ncredential = "k"\n'
    )
    assert (got.harness, got.test, got.push_credential, got.problem) == (
        "qwen",
        "make test",
        "k",
        None,
    )
    broken = parse("[harness\n")
    assert broken.harness is None
    assert broken.problem is not None
    assert "not valid TOML" in broken.problem
    typed = parse('harness = "qwen"\n[checks]\ntest = 3\n')
    assert typed.test is None
    assert typed.problem is not None
    assert "[harness] is not a table" in typed.problem
