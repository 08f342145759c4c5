"""Failed admin-token sign-ins, counted per peer in Postgres.

A peer is an IPv4 address or an IPv6 /64 (one host usually holds a whole /64, so counting
single IPv6 addresses would give an attacker 2^64 tries). Attempts that carry a token in
their body (the sign-in form, the chat's sign-in) are counted *before* the token is
compared, in one atomic upsert, so a burst of concurrent guesses cannot pass the limit; a
right token clears the count. ``Authorization: Bearer`` headers are counted before they
are compared too; a right one takes back only its own count (:func:`uncount`), so the
admin's scripts neither clear an attacker's count nor add to it. While the database is
away, bearer attempts are counted in this replica's memory instead (:data:`HERE`).
"""

from __future__ import annotations

import math
import time

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


class LocalCount:
    """This replica's own count of bearer attempts per peer, for while the database is away
    (the same rule as :func:`count`, on the monotonic clock; bounded, oldest windows out)."""

    MAX_PEERS = 10_000

    def __init__(self) -> None:
        self._peers: dict[str, tuple[float, int]] = {}  # peer: (window start, attempts)

    def count(self, peer: str, *, limit: int, window: float) -> None:
        now = time.monotonic()
        start, attempts = self._peers.get(peer, (now, 0))
        if start < now - window:
            start, attempts = now, 0
        self._peers[peer] = (start, attempts + 1)
        if len(self._peers) > self.MAX_PEERS:
            del self._peers[min(self._peers, key=lambda p: self._peers[p][0])]
        if attempts + 1 > limit:
            retry = max(1, math.ceil(start + window - now))
            raise TooManyAttempts(
                f"too many wrong admin tokens from {peer}; try again in {retry} s", retry
            )

    async def uncount(self, db: Db, peer: str) -> None:
        """Take back one attempt (``db`` unused: the signature of :func:`uncount`)."""
        if peer in self._peers:
            start, attempts = self._peers[peer]
            self._peers[peer] = (start, max(attempts - 1, 0))


HERE = LocalCount()
