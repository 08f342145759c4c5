"""Failed admin-token sign-ins, counted per peer in Postgres.

A peer is an IPv4 address or an IPv6 /64 (one host usually holds a whole /64, so counting
single IPv6 addresses would give an attacker 2^64 tries). Attempts that carry a token in
their body (the sign-in form, the chat's sign-in) are counted *before* the token is
compared, in one atomic upsert, so a burst of concurrent guesses cannot pass the limit; a
right token clears the count. ``Authorization: Bearer`` headers are counted before they
are compared too; a right one takes back only its own count (:func:`uncount`), so the
admin's scripts neither clear an attacker's count nor add to it.
"""

from __future__ import annotations

import math

from controlplane.db.pool import Db
from controlplane.errors import TooManyAttempts

_COUNT = (
    "INSERT INTO signin_throttle AS t (peer, window_start, failures) VALUES ($1, now(), 1) "
    "ON CONFLICT (peer) DO UPDATE SET "
    "failures = CASE WHEN t.window_start < now() - make_interval(secs => $2) "
    "  THEN 1 ELSE t.failures + 1 END, "
    "window_start = CASE WHEN t.window_start < now() - make_interval(secs => $2) "
    "  THEN now() ELSE t.window_start END "
    "RETURNING failures, "
    "  EXTRACT(EPOCH FROM t.window_start + make_interval(secs => $2) - now())::float"
)


async def count(db: Db, peer: str, *, limit: int, window: float) -> None:
    """Count one attempt from ``peer``; TooManyAttempts once it is over ``limit``."""
    row = await db.fetchrow(_COUNT, peer, float(window))
    assert row is not None
    failures, left = int(row[0]), float(row[1])
    if failures > limit:
        retry = max(1, math.ceil(left))
        raise TooManyAttempts(
            f"too many wrong admin tokens from {peer}; try again in {retry} s", retry
        )


async def clear(db: Db, peer: str) -> None:
    await db.execute("DELETE FROM signin_throttle WHERE peer = $1", peer)


async def uncount(db: Db, peer: str) -> None:
    """Take back one attempt counted by :func:`count` (it proved to be the right token)."""
    await db.execute(
        "UPDATE signin_throttle SET failures = greatest(failures - 1, 0) WHERE peer = $1", peer
    )
