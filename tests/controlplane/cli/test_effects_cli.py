"""``superagent effects``: dead effects are listed with their error and run again on retry."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from click.testing import CliRunner

from controlplane.cli.main import cli
from controlplane.effects.outbox import enqueue


async def _invoke(*args: str) -> tuple[int, str]:
    result = await asyncio.to_thread(CliRunner().invoke, cli, list(args))
    return result.exit_code, result.output


async def test_a_dead_effect_is_listed_and_retry_puts_it_back(
    pool: asyncpg.Pool, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", database_url)
    async with pool.acquire() as conn:
        await enqueue(conn, "reply", "k-1", {"text": "hello"})
    effect_id = await pool.fetchval(
        "UPDATE effects SET dead_at = now(), attempts = 8, last_error = 'HTTPError: 502' "
        "WHERE key = 'k-1' RETURNING id"
    )

    code, shown = await _invoke("effects", "list", "--dead")
    assert code == 0, shown
    assert effect_id in shown
    assert "HTTPError: 502" in shown
    code, status = await _invoke("status")
    assert f"release: superagent effects retry {effect_id}" in status, status

    code, said = await _invoke("effects", "retry", effect_id)
    assert code == 0, said
    row = await pool.fetchrow(
        "SELECT dead_at, attempts, next_attempt_at <= now() AS due FROM effects WHERE id = $1",
        effect_id,
    )
    assert row is not None
    assert (row["dead_at"], row["attempts"], row["due"]) == (None, 0, True)

    code, said = await _invoke("effects", "retry", effect_id)
    assert code == 1
    assert "is not dead" in said
    assert "Traceback" not in said
    code, said = await _invoke("effects", "retry", "eff_nosuchthing0")
    assert code == 1
    assert "no effect eff_nosuchthing0" in said
