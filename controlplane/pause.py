"""Pausing the agent: events are still recorded, nothing is evaluated, dispatched or said.

``superagent pause`` writes the single ``pause`` row; ``superagent resume`` deletes it and
everything held up resumes from where it was: the router's inbox is still there, and
postponed effects (replies, commands) run at their next attempt.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from controlplane.effects.handlers import Postpone

CHECK_SECONDS = 5.0  # how soon a postponed effect looks again


@dataclass(frozen=True)
class Paused:
    at: datetime
    by: str
    reason: str


async def pause(pool: asyncpg.Pool, by: str, reason: str = "") -> Paused:
    """Pause (or say since when it already is); the first pause's record is kept."""
    row = await pool.fetchrow(
        "WITH new AS (INSERT INTO pause (id, paused_by, reason) VALUES (1, $1, $2) "
        "ON CONFLICT (id) DO NOTHING RETURNING paused_at, paused_by, reason) "
        "SELECT * FROM new UNION ALL SELECT paused_at, paused_by, reason FROM pause "
        "WHERE NOT EXISTS (SELECT 1 FROM new) LIMIT 1",
        by,
        reason,
    )
    assert row is not None
    return Paused(row["paused_at"], row["paused_by"], row["reason"])


async def resume(pool: asyncpg.Pool) -> Paused | None:
    """Resume; returns the pause that ended, or None if the agent was not paused."""
    row = await pool.fetchrow("DELETE FROM pause RETURNING paused_at, paused_by, reason")
    return None if row is None else Paused(row["paused_at"], row["paused_by"], row["reason"])


async def current(pool: asyncpg.Pool) -> Paused | None:
    row = await pool.fetchrow("SELECT paused_at, paused_by, reason FROM pause")
    return None if row is None else Paused(row["paused_at"], row["paused_by"], row["reason"])


async def hold_while_paused(pool: asyncpg.Pool) -> None:
    """For effect handlers that act on the world: postpone while paused."""
    paused = await current(pool)
    if paused is not None:
        raise Postpone(CHECK_SECONDS, f"the agent is paused (since {paused.at:%H:%M:%S} UTC)")
