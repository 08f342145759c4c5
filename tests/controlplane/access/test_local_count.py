"""While the database is away, bearer attempts are counted in the replica's memory: still
counted before they are compared, still locked past the limit."""

from __future__ import annotations

import pytest

from controlplane.access.throttle import LocalCount
from controlplane.errors import TooManyAttempts


async def test_past_the_limit_a_peer_is_locked_and_a_right_token_takes_back_only_its_own() -> None:
    here = LocalCount()
    for _ in range(3):
        here.count("203.0.113.9", limit=3, window=60)
    with pytest.raises(TooManyAttempts, match=r"203\.0\.113\.9"):
        here.count("203.0.113.9", limit=3, window=60)
    here.count("198.51.100.1", limit=3, window=60)  # another peer is not locked by it
    await here.uncount(None, "198.51.100.1")  # type: ignore[arg-type]
    for _ in range(3):
        here.count("198.51.100.1", limit=3, window=60)


def test_the_peers_remembered_are_bounded() -> None:
    here = LocalCount()
    here.MAX_PEERS = 10
    for n in range(50):
        here.count(f"203.0.113.{n}", limit=1, window=60)
    assert len(here._peers) == 10
