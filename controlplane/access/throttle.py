"""Failed admin-token sign-ins, counted per peer in Postgres.

A peer is an IPv4 address or an IPv6 /64 (one host usually holds a whole /64, so counting
single IPv6 addresses would give an attacker 2^64 tries). Attempts that carry a token in
their body (the sign-in form, the chat's sign-in) are counted *before* the token is
compared, in one atomic upsert, so a burst of concurrent guesses cannot pass the limit; a
right token clears the count. A wrong ``Authorization: Bearer`` header counts as a failure.
"""

from __future__ import annotations

import math

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.errors import TooManyAttempts

_COUNT = text(
    "INSERT INTO signin_throttle AS t (peer, window_start, failures) VALUES (:peer, now(), 1) "
    "ON CONFLICT (peer) DO UPDATE SET "
    "failures = CASE WHEN t.window_start < now() - make_interval(secs => :window) "
    "  THEN 1 ELSE t.failures + 1 END, "
    "window_start = CASE WHEN t.window_start < now() - make_interval(secs => :window) "
    "  THEN now() ELSE t.window_start END "
    "RETURNING failures, "
    "  EXTRACT(EPOCH FROM t.window_start + make_interval(secs => :window) - now())::float"
)


async def count(engine: AsyncEngine, peer: str, *, limit: int, window: float) -> None:
    """Count one attempt from ``peer``; TooManyAttempts once it is over ``limit``."""
    async with engine.begin() as conn:
        row = (await conn.execute(_COUNT, {"peer": peer, "window": window})).one()
    failures, left = int(row[0]), float(row[1])
    if failures > limit:
        retry = max(1, math.ceil(left))
        raise TooManyAttempts(
            f"too many wrong admin tokens from {peer}; try again in {retry} s", retry
        )


async def clear(engine: AsyncEngine, peer: str) -> None:
    async with engine.begin() as conn:
        await conn.execute(text("DELETE FROM signin_throttle WHERE peer = :peer"), {"peer": peer})
