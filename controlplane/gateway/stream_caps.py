"""How many Connect streams the gateway holds: in all, and from one peer.

Anyone who can reach the gateway's port can open a stream before proving who they are (the
signed Hello comes after the Challenge), and each held stream costs a task and buffers. So
a stream is admitted only while fewer than ``max_streams`` are open, and fewer than
``max_streams_per_peer`` from its peer (an IPv4 address or an IPv6 /64, as every throttle
counts them); the next is refused at once with a reason naming the setting. A slot is
given back when its stream ends, however it ends.
"""

from __future__ import annotations

from collections import Counter


class StreamCaps:
    """Counts of open streams, in memory (each replica holds its own streams)."""

    def __init__(self, total: int, per_peer: int) -> None:
        self.total = total
        self.per_peer = per_peer
        self._open = 0
        self._by_peer: Counter[str] = Counter()

    def admit(self, peer: str) -> str | None:
        """Take a slot for a stream from ``peer``; None, or why it is refused."""
        if self._by_peer[peer] >= self.per_peer:
            return (
                f"this gateway holds its most device streams from one address "
                f"(SUPERAGENT_GRPC__MAX_STREAMS_PER_PEER={self.per_peer}); try again later"
            )
        if self._open >= self.total:
            return (
                f"this gateway holds its most device streams "
                f"(SUPERAGENT_GRPC__MAX_STREAMS={self.total}); try again later"
            )
        self._open += 1
        self._by_peer[peer] += 1
        return None

    def release(self, peer: str) -> None:
        """Give back the slot of a stream from ``peer`` that ended."""
        self._open -= 1
        self._by_peer[peer] -= 1
        if self._by_peer[peer] <= 0:
            del self._by_peer[peer]

    @property
    def open(self) -> int:
        return self._open
